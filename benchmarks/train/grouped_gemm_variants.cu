// Tile schedules of the grouped GEMM (libtrain/backend/cuda/grouped_gemm_sm90.cuh) other than the library's, timed
// beside it by grouped_gemm_bench at the MoE layer's shapes:
//   pingpong:  128 x 128 x 64 tiles, clusters of 2 along m, two consumer warp groups taking turns (one's epilogue
//              under the other's MMAs)
//   coop256:   256 x 128 x 64 tiles, clusters of 2 along m, both consumer warp groups on one tile
// for the forward form (kNT) and the weight-gradient form (kTNAccumulate, pingpong only).
#include "grouped_gemm_variants.h"

#include "backend/cuda/grouped_gemm_sm90.cuh"

#if DLM_HAVE_CUTLASS
namespace dlm::train::cuda::grouped_detail {
struct PingpongTiles {
  using Tile = Shape<_128, _128, _64>;
  using Cluster = Shape<_2, _1, _1>;
  using Mainloop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};
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
DLM_GROUPED_GEMM_FORM(grouped_tn_pingpong, ColumnMajor, RowMajor, float, float, grouped_detail::PingpongTiles)
