// The floating-point operations of one training iteration as Megatron-LM counts them
// (megatron/training/training.py, num_floating_point_operations -> transformer_flops, dense layers,
// at Megatron-LM d98e8a64), so that "throughput per GPU (TFLOP/s/GPU)" and progress.txt's FLOP counts
// compare with Megatron's for the same model:
//   F = 3 x 2 x B s [ h f e L + L (h (q + 2 k) + q h) + h V ] + 3 x 2 x B s^2 L q      (e = 3 for SwiGLU)
// B global batch, s sequence, h hidden, f ffn hidden, L layers, q = kv_channels x heads, k = kv_channels x
// query groups, V the padded vocabulary; 3 = forward + backward, 2 = multiply-add. The last term is Megatron's
// causal count (half of the s^2 scores); dlm's bidirectional attention computes all of them, and the count is
// kept as Megatron's so the numbers compare.
#pragma once

#include <cstdint>

namespace dlm::train {

struct FlopsShape {
  std::int64_t layers = 0, hidden = 0, ffn_hidden = 0, heads = 0, query_groups = 0, kv_channels = 0;
  std::int64_t padded_vocab = 0, seq_length = 0, global_batch_size = 0;
};

double megatron_flops_per_iteration(const FlopsShape& s);

}  // namespace dlm::train
