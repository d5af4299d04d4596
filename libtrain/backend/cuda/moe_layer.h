// CudaModel's mixture-of-experts layers (cuda_model_moe.cpp; math in dlm/train/moe_router.h, kernels in
// moe_kernels.h). Per MoE layer, in place of the dense MLP:
//   logits = h2 Wr^T (cuBLASLt, fp32 out) -> router kernel (top-k, weights) -> sort the T k slots by expert
//   -> xs = h2 gathered in that order -> gu = xs W1_e^T (one grouped GEMM) -> act = w * SwiGLU(gu)
//   -> ys = act W2_e^T (one grouped GEMM) -> out[n] = sum_j ys[where[n, j]]
// and the backward in reverse: the gathered output gradient dys -> dact = dys W2_e, dW2_e = dys^T act ->
// dgu and dw (moe_swiglu_backward) -> dW1_e = dgu^T xs, dxs = dgu W1_e -> dh = sum of each token's dxs rows
// (the weight gradients added into the fp32 gradients in the GEMM or after it: grouped_gemm.h),
// then the router: dlogits (aux and z losses included) -> dWr += dlogits^T h2, dh += dlogits Wr.
// A shared expert (LayerParams fc1 and fc2 of an MoE layer) is a dense SwiGLU on h2 whose fc2 adds into the
// combined output (beta 1), and whose data gradient adds into dh the same way.
// The forward waits once per layer for the experts' row counts (the grouped GEMM's sizes live on the host), so
// a model with MoE layers runs its sampling forwards eagerly (no CUDA graphs).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "device_arena.h"
#include "kernels.h"

namespace dlm::train::cuda {

// The grouped GEMMs of one MoE layer, each with three address arrays (A, B, C) of one entry per expert with rows.
enum MoeGemm { kMoeFc1, kMoeFc2, kMoeFc2Data, kMoeFc2Weight, kMoeFc1Data, kMoeFc1Weight, kMoeGemms };

// What one MoE layer keeps from its forward for its backward, per micro-batch in flight.
struct MoeLayerActs {
  float* logits = nullptr;                                                     // [T, E] router logits
  float* w = nullptr;                                                          // [T, k] routing weights
  int *idx = nullptr, *where = nullptr, *order = nullptr, *offsets = nullptr;  // [T, k], [T k], [T k], [E + 1]
  bf16 *gu = nullptr, *act = nullptr;                                          // [T k, 2 F], [T k, F]
  bf16 *shared_gu = nullptr, *shared_act = nullptr;                            // [T, 2 S], [T, S]
  const void** addresses = nullptr;  // device: kMoeGemms x 3 x E operand addresses
  const void** staged = nullptr;     // their pinned host copy
  // The groups of the last forward: the experts with rows, their row counts and first rows (host).
  std::vector<int> experts, rows, first;
  std::vector<std::int64_t> tokens_per_expert;  // [E]
  const void* const* gemm_operand(MoeGemm g, int operand, int experts_total) const {
    return addresses + (static_cast<std::int64_t>(g) * 3 + operand) * experts_total;
  }
};

// The work buffers the MoE layers share (every micro-batch, every layer), for T tokens.
struct MoeWork {
  bf16 *xs = nullptr, *ys = nullptr, *dys = nullptr;  // [T k, d]; ys is also the backward's dxs
  bf16 *dact = nullptr, *dgu = nullptr;               // [T k, F], [T k, 2 F] (or the shared expert's, if larger)
  bf16* dlogits = nullptr;                            // [T, E]
  bf16* part = nullptr;  // [E, 2 F, d]: one weight gradient before it is added (unless they are added in place)
  float* dw = nullptr;                                // [T, k]
  int* sort = nullptr;                                // moe_sort_scratch_ints
  int* offsets_host = nullptr;                        // pinned [E + 1]
};

struct MoeShape {
  int experts = 0, topk = 0, ffn = 0, hidden = 0;
  int shared = 0;  // the shared expert's width S (0: none)
  bool weight_gradients_in_place = false;  // GroupedGemm::fp32_output(): no `part`
};

class MoeBuffers {
 public:
  MoeBuffers() = default;
  ~MoeBuffers() { release(); }
  MoeBuffers(const MoeBuffers&) = delete;
  MoeBuffers& operator=(const MoeBuffers&) = delete;

  // The work buffers for micro-batches of `tokens` tokens; per-layer buffers come on demand.
  void allocate(const MoeShape& shape, std::int64_t tokens);
  void release();
  bool allocated() const { return tokens_ > 0; }
  // Layer l's buffers in activation slot s (allocated on first use; the address stays).
  MoeLayerActs* layer(int s, int l);
  MoeWork& work() { return work_; }
  const MoeShape& shape() const { return shape_; }
  std::size_t bytes() const { return arena_.bytes(); }
  // The last forward's row counts of each MoE layer (global layer order of this rank's layers), for tests.
  std::vector<std::vector<std::int64_t>> last_counts;

 private:
  MoeShape shape_;
  std::int64_t tokens_ = 0;
  MoeWork work_;
  std::vector<std::vector<std::unique_ptr<MoeLayerActs>>> slots_;
  std::vector<void*> pinned_;
  DeviceArena arena_;
  void* pinned(std::size_t bytes);
};

}  // namespace dlm::train::cuda
