// Expert parallelism of CudaModel's MoE layers (megatron-core's alltoall token dispatcher; the CPU reference is
// libtrain/model/model_moe_dispatch.cpp). With EP ranks in the expert-parallel group (CudaShard::expert) each holds
// E_l = E / EP experts; rank p's routed rows, sorted by expert (moe_layer.h's xs), are already grouped by
// destination rank (expert e lives on rank e / E_l). Per MoE layer (the host's part: parallel/expert_dispatch_plan.h):
//   counts:   counts[e] = rows of expert e here; all-to-all of E_l counts per peer, so each rank learns the rows it
//             receives, [EP, E_l] (the layer's one host wait: the all-to-all-v's counts live on the host, so a
//             model under EP runs eagerly, never in a CUDA graph);
//   dispatch: all-to-all-v of the rows (bf16) and of their routing weights (fp32); the received rows, in
//             (source rank, local expert) order, are permuted to (local expert, source rank) order (perm) so each
//             local expert's rows are contiguous;
//   experts:  the grouped GEMMs and the weighted SwiGLU as on one GPU (the same plan_expert_gemms and
//             run_expert_gemm, over ExpertRows of E_l groups whose offsets the plan uploads), on the received rows;
//   combine:  the outputs back to the received order (inv = perm^-1) and by the reverse all-to-all-v to the rows'
//             home, into xs's order, where moe_combine sums each token's k rows as without EP.
// The backward runs the same exchanges for d output (dispatch) and for d input and the routing weights' gradients
// (combine). Every rank runs the same MoE layers in the same order, so the collectives pair without tags.
// Dropless routing bounds the rows a rank receives by EP * T * k (every rank's every row); the buffers hold that.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "../../parallel/expert_dispatch_plan.h"
#include "device_arena.h"
#include "kernels.h"
#include "moe_dispatch_kernels.h"
#include "moe_layer.h"

namespace dlm::train::cuda {

// What one MoE layer keeps of its dispatch for its backward (per micro-batch in flight).
struct DispatchedRows {
  ExpertDispatchPlan plan;  // the host's: rows to and from each rank, the permutation, the local experts' offsets
  int *perm = nullptr, *inv = nullptr, *offsets = nullptr;  // the plan's on the device: [EP T k], [EP T k], [E_l + 1]
  bf16 *x = nullptr, *gu = nullptr, *act = nullptr;          // the permuted rows, [R, d], [R, 2F], [R, F]
  float* w = nullptr;                                        // their routing weights, received order [R]
  GroupedArgs gemms[kMoeGemms];  // device: each grouped GEMM's per-local-expert shapes, addresses and strides
};

// The dispatch's buffers for micro-batches of `tokens` tokens: the work buffers every layer shares, and each layer's
// DispatchedRows (keyed by its MoeLayerActs, which lives as long as the activations do).
class ExpertDispatch {
 public:
  ExpertDispatch() = default;
  ExpertDispatch(const ExpertDispatch&) = delete;
  ExpertDispatch& operator=(const ExpertDispatch&) = delete;

  // Allocates for `tokens` per micro-batch over `ranks` EP ranks unless it holds that shape (frees the layers' rows
  // otherwise: call it between steps, as the activations are).
  void reserve(const MoeShape& shape, std::int64_t tokens, int ranks);
  void release();
  DispatchedRows& layer(const MoeLayerActs* key);
  std::size_t bytes() const { return arena_.bytes(); }
  std::int64_t capacity() const { return capacity_; }  // rows a rank may receive: EP T k

  // Work buffers: rows in flight [EP T k, d] (two), the experts' SwiGLU gradients [EP T k, F] and [EP T k, 2F], the
  // weights' gradients in received order and in xs's order, the counts [2 E] (this rank's, then received) and
  // their host copy. (Host copies are pageable: their uploads are small, and a pageable upload leaves the host copy
  // free at once.)
  bf16 *rows_a = nullptr, *rows_b = nullptr, *dact = nullptr, *dgu = nullptr;
  float *dw = nullptr, *w_sorted = nullptr;
  int* counts = nullptr;
  std::vector<int> counts_host;

 private:
  MoeShape shape_;
  std::int64_t tokens_ = 0, capacity_ = 0;
  int ranks_ = 0;
  std::unordered_map<const MoeLayerActs*, std::unique_ptr<DispatchedRows>> layers_;
  DeviceArena arena_;
};

}  // namespace dlm::train::cuda
