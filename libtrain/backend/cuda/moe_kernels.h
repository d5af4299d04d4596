// The mixture-of-experts layer's kernels (docs/moe.md; the math is dlm/train/moe_router.h's, which the CPU
// reference computes): the router on its fp32 logits (moe_router.cu), and the token permutation around the
// experts' grouped GEMMs (moe_permute.cu). N tokens, E experts, top-k: the N * k (token, choice) slots are sorted by
// expert, slot order kept within an expert, so a run's rows (and the weight gradients' sums) are reproducible.
//   where[n * k + j] = the sorted row of slot (n, j);  order[row] = its slot;  offsets[e] = expert e's first row.
// The routing weight is applied on the experts' SwiGLU output (act' = w * silu(g) * u), which is linear, so the
// combine is a plain sum of each token's k rows and no expert output is kept for the backward.
#pragma once

#include "kernels.h"

namespace dlm::train::cuda {

// The router: E <= kMaxRouterExperts, k <= 32 (a warp per token, a lane per 32nd expert).
constexpr int kMaxRouterExperts = 256;
struct RouterShape {
  int tokens, experts, topk;
  bool sigmoid, norm_topk_prob;
};
//   forward: s = softmax(l) or sigmoid(l); the k largest s in decreasing order (ties: the lower expert) into idx
//   [N, k]; w = s / (sum of the k) when norm_topk_prob (+ 1e-20 for sigmoid), else s.
void moe_router_forward(const RouterShape& r, const float* logits, int* idx, float* w, cudaStream_t stream);
//   backward: d(loss_weight * (aux + z) + sum dw * w) / d logits into dlogits [N, E] (bf16: the router GEMMs'
//   input). counts come from offsets (the aux loss's c_e; at most `capacity` each when > 0); aux_scale =
//   loss_weight * coeff * E / (k N^2), z_scale = loss_weight * coeff_z * 2 / N. With `kept` (moe_drop_over_capacity;
//   null: dropless) a dropped slot's dw counts as 0 (its w, 0, carries no gradient; the normalisation saw it).
void moe_router_backward(const RouterShape& r, const float* logits, const int* idx, const float* w, const float* dw,
                         const int* offsets, const std::uint8_t* kept, int capacity, float aux_scale, float z_scale,
                         bf16* dlogits, cudaStream_t stream);

// The permutation. `chunk_counts` holds moe_sort_scratch_ints(slots, experts) ints.
std::int64_t moe_sort_scratch_ints(std::int64_t slots, int experts);
void moe_sort_by_expert(const int* idx, int slots, int experts, int* chunk_counts, int* offsets /*[E + 1]*/,
                        int* where, int* order, cudaStream_t stream);
// The capacity (moe_router.h's, Megatron's topk_softmax_with_capacity), after the sort: each expert keeps at most
// `capacity` of its rows, the first in slot order (by_position) or those of the largest w (ties: the earlier slot);
// kept[slot] = 0 and w[slot] = 0 for a dropped slot, kept = 1 for the others. A dropped slot's row still runs
// through its expert with w = 0: its output, its data gradient and its share of the weight gradients are zeros, as
// if it had been left out.
void moe_drop_over_capacity(const int* idx, const int* order, const int* offsets, int rows, int capacity,
                            bool by_position, float* w, std::uint8_t* kept, cudaStream_t stream);
// dst[row] = src[order[row] / k]  (rows = N * k, d % 8 == 0)
void moe_gather(const bf16* src, const int* order, int rows, int k, int d, bf16* dst, cudaStream_t stream);
// The same rows from the other side: dst[where[n * k + j]] = src[n] for the N tokens, k <= 32 (each token's row
// read once; where and order are inverse permutations, so this equals moe_gather(src, order, N * k, k, ...)).
void moe_expand(const bf16* src, const int* where, int tokens, int k, int d, bf16* dst, cudaStream_t stream);
// out[n] = add[n] + sum_j rows[where[n * k + j]], summed in fp32 in the order j (add may be null: 0)  (the forward's
// combine, and the backward's gradient of the gathered input; add: the shared expert's output or data gradient)
void moe_combine(const bf16* rows, const int* where, int tokens, int k, int d, const bf16* add, bf16* out,
                 cudaStream_t stream);
// act[row] = w[order[row]] * silu(g) * u on gu's rows [gate | up]; ffn % 8 == 0.
void moe_swiglu_forward(const bf16* gu, const float* w, const int* order, int rows, int ffn, bf16* act,
                        cudaStream_t stream);
//   backward from dact (d act'): dw[order[row]] = sum dact * silu(g) * u (the routing weight's gradient, a block
//   per row in a fixed order), dgu = the SwiGLU backward of w * dact.
void moe_swiglu_backward(const bf16* dact, const bf16* gu, const float* w, const int* order, int rows, int ffn,
                         bf16* dgu, float* dw, cudaStream_t stream);
// grad[e] = 0 for every expert e without rows (offsets); grad is [E, per_expert], per_expert % 4 == 0. After a weight
// gradient's grouped GEMM that overwrote (beta 0): it skips those experts, whose gradient is zero.
void moe_clear_empty_experts(float* grad, const int* offsets, int experts, std::int64_t per_expert,
                             cudaStream_t stream);

}  // namespace dlm::train::cuda
