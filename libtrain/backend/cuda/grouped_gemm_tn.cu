// grouped_gemm.h's form kTNAccumulate: A stored [k, m] (CUTLASS's column-major M x K), B [k, n]
// row-major, C fp32 += the product.
#include "grouped_gemm_sm90.cuh"

DLM_GROUPED_GEMM_FORM(grouped_tn, ColumnMajor, RowMajor, float, float, grouped_detail::PingpongTiles)
