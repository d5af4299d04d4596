// CudaModel's mixture-of-experts layers (cuda_model_moe.cpp; math in dlm/train/moe_router.h, kernels in
// moe_kernels.h). Per MoE layer, in place of the dense MLP:
//   logits = h2 Wr^T (cuBLASLt, fp32 out) -> router kernel (top-k, weights) -> sort the T k slots by expert
//   -> xs = h2 gathered in that order -> gu = xs W1_e^T (one grouped GEMM) -> act = w * SwiGLU(gu)
//   -> ys = act W2_e^T (one grouped GEMM) -> out[n] = sum_j ys[where[n, j]]
// and the backward in reverse: the gathered output gradient dys -> dact = dys W2_e, dW2_e = dys^T act ->
// dgu and dw (moe_swiglu_backward) -> dW1_e = dgu^T xs, dxs = dgu W1_e -> dh = sum of each token's dxs rows
// (the weight gradients written into the fp32 gradients by their grouped GEMMs: the first after zero_grad
// overwrites, the empty experts' cleared after it, later micro-batches add),
// then the router: dlogits (aux and z losses included) -> dWr += dlogits^T h2, dh += dlogits Wr.
// A shared expert (LayerParams fc1 and fc2 of an MoE layer) is a dense SwiGLU on h2 whose output the combine adds to
// the routed experts' sum, and whose data gradient the backward's combine adds to dh the same way. It runs whole on
// a side stream (side_stream.h) beside the routing and the routed experts, whose kernels are partly memory-bound,
// and joins back before the combine.
// No host wait: the grouped GEMMs (grouped_gemm.h) read the experts' row counts on the device, from the per-group
// arrays that one grouped_plan launch per layer fills after the sort, so the layer is captured in CUDA graphs as
// the dense MLP is.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "device_arena.h"
#include "grouped_gemm.h"
#include "kernels.h"

namespace dlm::train::cuda {

// The grouped GEMMs of one MoE layer (a group per expert).
enum MoeGemm { kMoeFc1, kMoeFc2, kMoeFc2Data, kMoeFc2Weight, kMoeFc1Data, kMoeFc1Weight, kMoeGemms };

// What one MoE layer keeps from its forward for its backward, per micro-batch in flight.
struct MoeLayerActs {
  float* logits = nullptr;                                                     // [T, E] router logits
  float* w = nullptr;                                                          // [T, k] routing weights
  int *idx = nullptr, *where = nullptr, *order = nullptr, *offsets = nullptr;  // [T, k], [T k], [T k], [E + 1]
  std::uint8_t* kept = nullptr;  // [T, k] with a capacity factor (moe_drop_over_capacity); null when dropless
  bf16 *xs = nullptr;                                                          // [T k, d] the gathered input
  bf16 *gu = nullptr, *act = nullptr;                                          // [T k, 2 F], [T k, F]
  bf16 *shared_gu = nullptr, *shared_act = nullptr;                            // [T, 2 S], [T, S]
  GroupedArgs gemms[kMoeGemms];  // device: each grouped GEMM's per-expert shapes, addresses and strides
};

// The rows a layer's grouped GEMMs run on, grouped by expert, and those GEMMs' device arrays: on one GPU the layer's
// sorted rows over all E experts (MoeLayerActs, MoeWork); under expert parallelism the rows received from the EP
// group over this rank's E / EP experts (moe_dispatch.h). x, gu, act are kept for the backward; y is the forward's
// output, dy, dact, dgu the backward's work and dx its output (dx may be y, and dy's memory).
struct ExpertRows {
  const int* offsets = nullptr;  // device [groups + 1]: group g's rows are [offsets[g], offsets[g + 1])
  int groups = 0;
  bf16 *x = nullptr, *gu = nullptr, *act = nullptr;
  bf16 *y = nullptr, *dy = nullptr, *dact = nullptr, *dgu = nullptr, *dx = nullptr;
  GroupedArgs* gemms = nullptr;  // [kMoeGemms]
};

// The work buffers the MoE layers share (every micro-batch, every layer), for T tokens.
struct MoeWork {
  bf16 *ys = nullptr, *dys = nullptr;                 // [T k, d]; ys is also the backward's dxs
  bf16 *dact = nullptr, *dgu = nullptr;               // [T k, F], [T k, 2 F]
  bf16 *shared_dact = nullptr, *shared_dgu = nullptr; // [T, S], [T, 2 S]: the shared expert's, on the side stream
  bf16* shared_out = nullptr;  // [T, d]: its output (forward) or its input's gradient (backward), for the combine
  bf16* dlogits = nullptr;                            // [T, E]
  float* dw = nullptr;                                // [T, k]
  int* sort = nullptr;                                // moe_sort_scratch_ints
};

struct MoeShape {
  int experts = 0, topk = 0, ffn = 0, hidden = 0;
  int shared = 0;  // the shared expert's width S (0: none)
  double capacity_factor = 0;  // > 0: each expert keeps at most capacity(tokens) of its slots (moe_router.h)
  bool drop_by_position = false;  // which it keeps: the earliest slots, or (false) those of the largest weights
  // The most slots an expert keeps of `tokens` tokens' (expert_capacity, moe_router.h); 0 when dropless.
  int capacity(std::int64_t tokens) const;
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
  // Per layer (this rank's order), the device offsets [E + 1] of its last forward (null before one) and that
  // forward's capacity (0: dropless): read back only when asked (CudaModel::moe_tokens_per_expert).
  std::vector<const int*> last_offsets;
  std::vector<int> last_capacity;

 private:
  MoeShape shape_;
  std::int64_t tokens_ = 0;
  MoeWork work_;
  std::vector<std::vector<std::unique_ptr<MoeLayerActs>>> slots_;
  DeviceArena arena_;
};

}  // namespace dlm::train::cuda
