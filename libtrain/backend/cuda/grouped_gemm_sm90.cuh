// The grouped GEMM kernel of grouped_gemm.h as a CUTLASS 3 type, one instantiation per .cu file (grouped_gemm_nt.cu,
// _nn.cu, _tn.cu: nvcc spends minutes and gigabytes on each). A ptr-array grouped GEMM: per group, the (m, n, k)
// shape, the three operand addresses and the row strides are read on the device (GroupProblemShape without host
// shapes), so the persistent grid has a CTA per multiprocessor whatever the counts, and a group with no tiles costs
// nothing.
// The data GEMMs (kNT, kNN): cooperative schedule, 128 x 256 x 64 tiles, clusters of 2 along m, torch._grouped_mm's
// choice for Hopper's large groups (the experts' groups here hold hundreds to thousands of rows). The weight
// gradients (kTNAccumulate): pingpong, 128 x 128 x 64 tiles, one consumer warp group's epilogue (an fp32 tile per
// expert and tile: a large output for a short k) under the other's MMAs; grouped_gemm_bench times both.
// DLM_GROUPED_GEMM_FORM defines one form's pair of grouped_gemm.h functions (stubs in a build without CUTLASS); a
// sixth argument names other tiles than CooperativeTiles.
#pragma once

#include "grouped_gemm.h"

#if DLM_HAVE_CUTLASS

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

namespace dlm::train::cuda::grouped_detail {

using namespace cute;
using Bf = cutlass::bfloat16_t;

// The library's tile schedules (the header's opening comment); benchmarks/train/grouped_gemm_variants.cu times others.
struct CooperativeTiles {
  using Tile = Shape<_128, _256, _64>;
  using Cluster = Shape<_2, _1, _1>;
  using Mainloop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
struct PingpongTiles {
  using Tile = Shape<_128, _128, _64>;
  using Cluster = Shape<_2, _1, _1>;
  using Mainloop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

// LayoutA / LayoutB in CUTLASS's column-major-of-(M, K) / (N, K) sense; ElementC void (C is not read) or float
// (C = D, the fp32 gradient added into with beta 1; with beta 0 the epilogue does not read it).
template <class LayoutA, class LayoutB, class ElementC, class ElementD, class Tiles = CooperativeTiles>
struct Sm90Grouped {
  using Problem = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using LayoutD = cutlass::layout::RowMajor;
  using TileShape = typename Tiles::Tile;
  using ClusterShape = typename Tiles::Cluster;
  static constexpr int kAlignAB = 8, kAlignD = 16 / static_cast<int>(sizeof(ElementD));
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD*, kAlignD, ElementD, LayoutD*,
      kAlignD, typename Tiles::Epilogue>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf, LayoutA*, kAlignAB, Bf, LayoutB*, kAlignAB, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Tiles::Mainloop>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Mainloop, Epilogue>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // GroupedArgs' plain arrays read as CUTLASS's types: a shape is three ints, and each stride holds one dynamic
  // int64 (the leading dimension; the unit and batch strides are static).
  static_assert(sizeof(typename Problem::UnderlyingProblemShape) == 3 * sizeof(int));
  static_assert(sizeof(typename Kernel::InternalStrideA) == 8 && sizeof(typename Kernel::InternalStrideB) == 8 &&
                sizeof(typename Kernel::InternalStrideD) == 8);

  static typename Device::Arguments arguments(const GroupedLaunch& l) {
    using StrideA = typename Kernel::InternalStrideA;
    using StrideB = typename Kernel::InternalStrideB;
    using StrideC = typename Kernel::InternalStrideC;
    using StrideD = typename Kernel::InternalStrideD;
    constexpr bool accumulate = !cute::is_void_v<ElementC>;
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = l.sm_count;
    auto* d = reinterpret_cast<ElementD**>(l.args.c);
    typename Device::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {l.groups, reinterpret_cast<typename Problem::UnderlyingProblemShape*>(l.args.shapes), nullptr},
        {reinterpret_cast<const Bf**>(l.args.a), reinterpret_cast<StrideA*>(l.args.lda),
         reinterpret_cast<const Bf**>(l.args.b), reinterpret_cast<StrideB*>(l.args.ldb)},
        {{}, nullptr, reinterpret_cast<StrideC*>(l.args.ldc), d, reinterpret_cast<StrideD*>(l.args.ldc)},
        hw};
    if constexpr (accumulate) args.epilogue.ptr_C = static_cast<const ElementC**>(static_cast<void*>(l.args.c));
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = accumulate ? l.beta : 0.0f;
    args.epilogue.thread.dAlpha = {_0{}, _0{}, 0};
    args.epilogue.thread.dBeta = {_0{}, _0{}, 0};
    return args;
  }

  static std::size_t workspace(const GroupedLaunch& l) { return Device::get_workspace_size(arguments(l)); }

  static bool run(const GroupedLaunch& l, cudaStream_t stream) {
    const auto args = arguments(l);
    Device gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
    if (gemm.initialize(args, l.workspace, stream) != cutlass::Status::kSuccess) return false;
    return gemm.run(stream) == cutlass::Status::kSuccess;
  }
};

}  // namespace dlm::train::cuda::grouped_detail

#define DLM_GROUPED_GEMM_FORM(name, LayoutA, LayoutB, ElementC, ElementD, ...)                                     \
  namespace dlm::train::cuda {                                                                                     \
  namespace {                                                                                                      \
  using name##_kernel = grouped_detail::Sm90Grouped<cutlass::layout::LayoutA, cutlass::layout::LayoutB, ElementC, \
                                                    ElementD, ##__VA_ARGS__>;                                       \
  }                                                                                                                \
  std::size_t name##_workspace(const GroupedLaunch& l) { return name##_kernel::workspace(l); }                    \
  bool name(const GroupedLaunch& l, cudaStream_t stream) { return name##_kernel::run(l, stream); }                 \
  }

#else

#define DLM_GROUPED_GEMM_FORM(name, LayoutA, LayoutB, ElementC, ElementD, ...)     \
  namespace dlm::train::cuda {                                                     \
  std::size_t name##_workspace(const GroupedLaunch&) { return 0; }                 \
  bool name(const GroupedLaunch&, cudaStream_t) { return false; }                  \
  }

#endif
