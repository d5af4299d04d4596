// Tile schedules of the grouped GEMM (libtrain/backend/cuda/grouped_gemm_sm90.cuh) other than the library's, timed
// beside it by grouped_gemm_bench at the MoE layer's shapes:
//   pingpong:     128 x 128 x 64 tiles, clusters of 2 along m, two consumer warp groups taking turns (one's
//                 epilogue under the other's MMAs): the forward form's (kNT) other schedule
//   coop256:      256 x 128 x 64 tiles, clusters of 2 along m, both consumer warp groups on one tile (kNT)
//   cooperative:  the data forms' 128 x 256 x 64 cooperative tiles for the weight-gradient form (kTNAccumulate)
#include "grouped_gemm_variants.h"

#include "backend/cuda/grouped_gemm_sm90.cuh"

#if DLM_HAVE_CUTLASS
namespace dlm::train::cuda::grouped_detail {
struct Cooperative256Tiles {
  using Tile = Shape<_256, _128, _64>;
  using Cluster = Shape<_2, _1, _1>;
  using Mainloop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
}  // namespace dlm::train::cuda::grouped_detail
#endif

DLM_GROUPED_GEMM_FORM(grouped_nt_pingpong, RowMajor, ColumnMajor, void, cutlass::bfloat16_t, grouped_detail::PingpongTiles)
DLM_GROUPED_GEMM_FORM(grouped_nt_coop256, RowMajor, ColumnMajor, void, cutlass::bfloat16_t, grouped_detail::Cooperative256Tiles)
DLM_GROUPED_GEMM_FORM(grouped_tn_cooperative, ColumnMajor, RowMajor, float, float, grouped_detail::CooperativeTiles)
