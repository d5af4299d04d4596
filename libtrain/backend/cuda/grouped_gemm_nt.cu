// grouped_gemm.h's form kNT: A [m, k] row-major, B stored [n, k] (CUTLASS's column-major K x N), C bf16.
#include "grouped_gemm_sm90.cuh"

DLM_GROUPED_GEMM_FORM(grouped_nt, RowMajor, ColumnMajor, void, cutlass::bfloat16_t)

namespace dlm::train::cuda {
#if DLM_HAVE_CUTLASS
bool grouped_sm90_built() { return true; }
#else
bool grouped_sm90_built() { return false; }
#endif
}  // namespace dlm::train::cuda
