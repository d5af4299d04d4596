// The mixture-of-experts router: scores, top-k, combine weights, and Megatron's router losses (docs/moe.md).
//
// For N tokens, E experts, router logits l [N, E]:
//   softmax: s = softmax(l);  sigmoid: s = sigmoid(l)
//   top-k:   the k largest s of each row, in decreasing order; ties go to the lower expert index
//   weights: w_j = s_{e_j}, divided by their sum when norm_topk_prob (+ 1e-20 for sigmoid, as Megatron)
//   aux:     coeff * E / (k N^2) * sum_e c_e * sum_n a[n, e]      (Megatron's switch_load_balancing_loss_func)
//            c_e = tokens routed to e; a = s (softmax) or s / (sum_e s + 1e-20) (sigmoid); c is a constant.
//   z:       coeff_z / N * sum_n logsumexp(l[n])^2                  (Megatron's z_loss_func)
//   capacity (capacity_factor > 0; Megatron's topk_softmax_with_capacity): each expert keeps at most
//            C = ceil(N k / E * capacity_factor) of its routed tokens, those with the largest w (ties: the earlier
//            token) or, by position, the earliest; a dropped slot's w is 0 (the others are not renormalised) and
//            carries no gradient, and c_e counts the kept tokens.
// The CPU reference computes it on the host: the logits of one layer are small ([N, E]).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dlm/ckpt/model_config.h"

namespace dlm::train {

struct RouterOptions {
  int experts = 0, topk = 0;
  ckpt::MoeScoreFunction score = ckpt::MoeScoreFunction::kSoftmax;
  bool norm_topk_prob = true;
  double aux_loss_coeff = 0, z_loss_coeff = 0;
  double capacity_factor = 0;  // 0: dropless
  ckpt::MoeDropPolicy drop_policy = ckpt::MoeDropPolicy::kProbs;
  static RouterOptions of(const ckpt::ModelConfig& config);
};

struct Routing {
  std::int64_t tokens = 0;
  std::vector<float> logits;                     // [N, E] l
  std::vector<float> scores;                     // [N, E] s
  std::vector<std::int32_t> experts;             // [N, k] chosen experts, decreasing score
  std::vector<float> weights;                    // [N, k] combine weights (0 for a dropped slot)
  std::vector<std::uint8_t> kept;                // [N, k] 0 for a slot over its expert's capacity; empty: dropless
  std::int64_t capacity = 0;                     // C (0: dropless)
  std::vector<float> lse;                        // [N] logsumexp of the logits (z-loss)
  std::vector<std::int64_t> tokens_per_expert;   // [E] c
  std::vector<double> aux_probability_sum;       // [E] sum_n a[n, e]
  double aux_loss = 0, z_loss = 0;               // coefficients applied
};

// Megatron's get_capacity(slots, E, capacity_factor) for `slots` = N k routed slots: ceil(slots / E *
// capacity_factor), the most each expert keeps; 0 when dropless (capacity_factor <= 0). Both backends take it.
std::int64_t expert_capacity(std::int64_t slots, int experts, double capacity_factor);

// Routes N = logits.size() / E tokens; a non-finite logit is a dlm::Error naming its token.
Routing route(const RouterOptions& options, std::span<const float> logits);

// d(loss_weight * (aux + z) + sum_{n,j} dweights[n, j] * w[n, j]) / d logits, written into dlogits [N, E].
void route_backward(const RouterOptions& options, const Routing& routing, std::span<const float> dweights,
                    double loss_weight, std::span<float> dlogits);

}  // namespace dlm::train
