// grouped_gemm.h's form kNN: A [m, k] row-major, B stored [k, n] row-major, C bf16.
#include "grouped_gemm_sm90.cuh"

DLM_GROUPED_GEMM_FORM(grouped_nn, RowMajor, RowMajor, void, cutlass::bfloat16_t)
