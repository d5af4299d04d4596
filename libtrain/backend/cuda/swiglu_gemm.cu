// SwigluBackwardGemm: a CUTLASS 3 warp-specialized Hopper GEMM (TMA loads, wgmma, persistent tiles) whose
// epilogue is a visitor graph over each tile of the accumulator acc = dh (swiglu_gemm.h has the math): g and u,
// TMA-loaded tiles of gu's two halves (row stride 2F), are read once and feed both
//   du = acc * g * sig(g)                            -> stored into dgu's up half (an aux store), and
//   dg = acc * u * sig(g) * (1 + g * (1 - sig(g)))   -> the kernel's output D, dgu's gate half.
#include "swiglu_gemm.h"

#if DLM_HAVE_CUTLASS

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

namespace dlm::train::cuda {
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;
using Bf = cutlass::bfloat16_t;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// On the device the fast reciprocal (MUFU.RCP, 1 ulp): the IEEE division and __frcp_rn call a slow path for
// special values, and a call inside the kernel serializes its wgmma pipeline (ptxas C7510).
[[maybe_unused]] CUTLASS_HOST_DEVICE float sigmoid(float g) {
#ifdef __CUDA_ARCH__
  return __fdividef(1.0f, 1.0f + __expf(-g));
#else
  return 1.0f / (1.0f + std::exp(-g));
#endif
}

// The element functions take fragments (cutlass::Array) as Sm90Compute calls them; the scalar forms are for the
// argument deduction Sm90Compute does on ComputeFn<ElementCompute>.
template <class T>
struct GateGrad {
  CUTLASS_HOST_DEVICE T operator()(T dh, T g, T u) const {
    const float s = sigmoid(g);
    return dh * u * s * (1.0f + g * (1.0f - s));
  }
};
template <class T, int N>
struct GateGrad<cutlass::Array<T, N>> {
  CUTLASS_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& dh, cutlass::Array<T, N> const& g,
                                                 cutlass::Array<T, N> const& u) const {
    cutlass::Array<T, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      const float s = sigmoid(g[i]);
      out[i] = dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
    return out;
  }
};
template <class T>
struct UpGrad {
  CUTLASS_HOST_DEVICE T operator()(T dh, T g) const { return dh * g * sigmoid(g); }
};
template <class T, int N>
struct UpGrad<cutlass::Array<T, N>> {
  CUTLASS_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& dh, cutlass::Array<T, N> const& g) const {
    cutlass::Array<T, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = dh[i] * g[i] * sigmoid(g[i]);
    return out;
  }
};
// The graph's output node: its first input (the gate gradient); the second (the stored up gradient) only
// orders the store before it.
template <class T>
struct First {
  CUTLASS_HOST_DEVICE T operator()(T a, T) const { return a; }
};

using LayoutA = cutlass::layout::RowMajor;  // dy [T, d]
using LayoutB = cutlass::layout::RowMajor;  // W2 [d, F]: K x N with N contiguous
using LayoutD = cutlass::layout::RowMajor;  // dgu halves [T, F], row stride 2F
constexpr int kAlign = 8;                   // 16 bytes of bf16

// Ping-pong: two consumer warp groups take turns, one's epilogue (the aux loads, the SwiGLU math, two stores)
// overlapping the other's MMAs. A cooperative schedule's epilogue holds up the MMAs, which costs more than the
// fusion saves; the tile and cluster shapes are the fastest of those timed at the benchmark models' fc2 shapes
// (the profile's "gemm fc2 bwd + swiglu bwd" phase, cuda_train_bench --profile).
using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_2, _1, _1>;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
using EpilogueDescriptor =
    cutlass::epilogue::collective::detail::EpilogueDescriptor<TileShape, cutlass::epilogue::collective::EpilogueTileAuto,
                                                              void, Bf, EpilogueSchedule>;
using AuxLoadDesc = cutlass::epilogue::collective::detail::AuxLoadDescriptor<EpilogueDescriptor, LayoutD, Bf>;
using AuxStoreDesc = cutlass::epilogue::collective::detail::AuxStoreDescriptor<EpilogueDescriptor, LayoutD, Bf>;
using AuxLoad = fusion::Sm90AuxLoad<AuxLoadDesc::Stages, typename EpilogueDescriptor::EpilogueTile, Bf,
                                    typename AuxLoadDesc::Stride, typename AuxLoadDesc::SmemLayoutAtom,
                                    typename AuxLoadDesc::CopyOpS2R>;
using AuxStore = fusion::Sm90AuxStore<AuxStoreDesc::Stages, typename EpilogueDescriptor::EpilogueTile, Bf, kRound,
                                      typename AuxStoreDesc::Stride, typename AuxStoreDesc::SmemLayoutAtom,
                                      typename AuxStoreDesc::CopyOpR2S>;
// Topological order: 0 acc, 1 g, 2 u, 3 du, 4 store du, 5 dg, 6 out.
using Edges = cute::tuple<cute::seq<>, cute::seq<>, cute::seq<>, cute::seq<0, 1>, cute::seq<3>, cute::seq<0, 1, 2>,
                          cute::seq<5, 4>>;
using Fusion = fusion::Sm90TopologicalVisitor<float, Edges, fusion::Sm90AccFetch, AuxLoad, AuxLoad,
                                              fusion::Sm90Compute<UpGrad, float, float, kRound>, AuxStore,
                                              fusion::Sm90Compute<GateGrad, float, float, kRound>,
                                              fusion::Sm90Compute<First, Bf, float, kRound>>;
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlign, Bf, LayoutD, kAlign,
    EpilogueSchedule, Fusion>::CollectiveOp;
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf, LayoutA, kAlign, Bf, LayoutB, kAlign, float, TileShape,
    ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue,
                                                    cutlass::gemm::PersistentScheduler>;
using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

SwigluBackwardGemm::SwigluBackwardGemm() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  available_ = major == 9 && minor == 0;  // the kernel is sm_90a machine code
}

SwigluBackwardGemm::~SwigluBackwardGemm() {
  if (workspace_) cudaFree(workspace_);
}

bool SwigluBackwardGemm::run(const bf16* dy, const bf16* w2, const bf16* gu, bf16* dgu, int tokens, int hidden,
                             int ffn, cudaStream_t stream) {
  if (!available_ || tokens <= 0 || hidden % kAlign != 0 || ffn % kAlign != 0) return false;
  if (!aligned(dy) || !aligned(w2) || !aligned(gu) || !aligned(dgu)) return false;
  const auto F = static_cast<int64_t>(ffn), D = static_cast<int64_t>(hidden);
  // Row-major strides in CUTLASS's (M, K, L) / (N, K, L) / (M, N, L) order; the unit strides are static.
  typename Kernel::StrideA stride_a{};
  get<0>(stride_a) = D;
  typename Kernel::StrideB stride_b{};
  get<1>(stride_b) = F;
  typename Kernel::StrideD stride_half{};
  get<0>(stride_half) = 2 * F;  // a row of gu / dgu holds both halves
  const auto* gu_c = reinterpret_cast<const Bf*>(gu);
  auto* dgu_c = reinterpret_cast<Bf*>(dgu);
  cutlass::KernelHardwareInfo hw;
  check_cuda(cudaGetDevice(&hw.device_id), "cudaGetDevice");
  hw.sm_count = multiprocessors();
  typename Device::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {tokens, ffn, hidden, 1},
                                  {reinterpret_cast<const Bf*>(dy), stride_a, reinterpret_cast<const Bf*>(w2), stride_b},
                                  {{}, nullptr, stride_half, dgu_c, stride_half},
                                  hw};
  // Node arguments in topological order (acc, g, u, du, store, dg, out).
  args.epilogue.thread = {{}, {gu_c, Bf(0), stride_half}, {gu_c + F, Bf(0), stride_half}, {}, {dgu_c + F, stride_half},
                          {}, {}};
  Device gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
  const std::size_t need = Device::get_workspace_size(args);
  if (need > workspace_bytes_) {
    if (workspace_) cudaFree(workspace_);
    workspace_ = nullptr, workspace_bytes_ = 0;
    check_cuda(cudaMalloc(&workspace_, need), "SwiGLU GEMM workspace");
    workspace_bytes_ = need;
  }
  if (gemm.initialize(args, workspace_, stream) != cutlass::Status::kSuccess) return false;
  return gemm.run(stream) == cutlass::Status::kSuccess;
}

}  // namespace dlm::train::cuda

#else  // no CUTLASS in this build: the unfused pair runs

namespace dlm::train::cuda {
SwigluBackwardGemm::SwigluBackwardGemm() = default;
SwigluBackwardGemm::~SwigluBackwardGemm() = default;
bool SwigluBackwardGemm::run(const bf16*, const bf16*, const bf16*, bf16*, int, int, int, cudaStream_t) { return false; }
}  // namespace dlm::train::cuda

#endif
