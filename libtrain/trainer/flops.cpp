// Megatron's FLOP count of an iteration (include/dlm/train/flops.h).
#include "dlm/train/flops.h"

namespace dlm::train {

double megatron_flops_per_iteration(const FlopsShape& s) {
  const double h = static_cast<double>(s.hidden), layers = static_cast<double>(s.layers);
  const double q = static_cast<double>(s.kv_channels * s.heads), k = static_cast<double>(s.kv_channels * s.query_groups);
  const double tokens = static_cast<double>(s.global_batch_size) * static_cast<double>(s.seq_length);
  constexpr double kFwdBwd = 3, kFma = 2, kSwiGlu = 3;
  const double mlp = h * static_cast<double>(s.ffn_hidden) * kSwiGlu * layers;
  const double attention = layers * (h * (q + 2 * k) + q * h);
  const double logits = h * static_cast<double>(s.padded_vocab);
  const double per_token = kFwdBwd * kFma * (mlp + attention + logits);
  // Megatron: B s^2 x 3 x 2 x q / 2 (causal) x 2 (QK^T and its product with V), per layer.
  const double core = tokens * static_cast<double>(s.seq_length) * kFwdBwd * kFma * q * layers;
  return tokens * per_token + core;
}

}  // namespace dlm::train
