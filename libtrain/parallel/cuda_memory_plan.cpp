// The CUDA backend's activation and work-buffer bytes (see include/dlm/train/cuda_memory_plan.h). Each term
// names the buffer of cuda_model_impl.h it stands for; a change there must change it here (the dry run's
// figures are checked against measured peaks: docs/parallelism.md).
#include "dlm/train/cuda_memory_plan.h"

#include <algorithm>

namespace dlm::train {

CudaActivationBytes cuda_activation_bytes(const ckpt::ModelConfig& c, std::int64_t tokens, int tensor,
                                          bool sequence_parallel, bool pre, bool post, bool recompute) {
  const double T = static_cast<double>(tokens), t = tensor;
  const bool sp = sequence_parallel && tensor > 1;
  const double Ts = sp ? T / t : T, d = c.hidden_size;
  const double heads = c.num_attention_heads / t, groups = c.num_query_groups / t, ch = c.kv_channels;
  const double qkv = (heads + 2 * groups) * ch, q = heads * ch, ffn = c.ffn_hidden_size / t;
  const auto vpad = static_cast<double>(c.padded_vocab_size() / tensor);
  const double bf16 = 2, f32 = 4;
  CudaActivationBytes b;
  // LayerActs: res1, res2 (rank's rows); h1, h2 (every row); qkv_raw, qkv_rot; att; gu; act; rstd1, rstd2;
  // qk_rstd; lse. Recomputing, a slot's layer holds res1 and the rest is `work`, one layer's worth.
  const double layer_input = Ts * d * bf16;
  const double layer_rest = Ts * d * bf16 + 2 * T * d * bf16 + 2 * T * qkv * bf16 + T * q * bf16 +
                            T * 2 * ffn * bf16 + T * ffn * bf16 + 2 * Ts * f32 + T * (heads + groups) * f32 +
                            T * heads * f32;
  b.per_layer_slot = recompute ? layer_input : layer_input + layer_rest;
  // ensure_acts: the logits chunk's rows, then tmp, res_f, dres16, dh; hf; logits; dact; under SP tmp_full,
  // hloc, dres16_full, dh_full; before the last stage stage_out and dres_in; dgu, datt, dqkv_rot, dqkv;
  // rstd_f, dres, delta; dres_full (SP on the first stage); head_x where dgu is too small for it; the
  // vocabulary-parallel CE's statistics; the embedding backward's partial rows (2 per 32 tokens, + 2).
  const double budget_rows = std::max(64.0, static_cast<double>(static_cast<std::int64_t>(kCudaLogitsBudget / (2 * vpad)) / 64 * 64));
  const double chunk = std::min(T, budget_rows);
  b.shared = 4 * Ts * d * bf16 + T * d * bf16 + chunk * vpad * bf16 + T * ffn * bf16;
  if (sp) b.shared += 3 * T * d * bf16 + Ts * d * bf16;
  if (!post) b.shared += Ts * d * bf16 + Ts * d * f32;
  b.shared += T * 2 * ffn * bf16 + T * q * bf16 + 2 * T * qkv * bf16 + Ts * f32 + Ts * d * f32 + T * heads * f32;
  if (sp && pre) b.shared += T * d * f32;
  if (recompute) b.shared += layer_rest;
  if (post && 2 * ffn < d) b.shared += T * d * bf16;  // head_x, when dgu cannot hold it
  if (tensor > 1) b.shared += (t + 1) * chunk * f32;
  b.shared += (2 * static_cast<double>(tokens / 32) + 2) * d * f32;
  // use_head: res_f, hf and rstd_f of each further slot on the last stage.
  b.per_extra_head_slot = post ? Ts * d * bf16 + T * d * bf16 + Ts * f32 : 0;
  // input_set: ids, labels, positions, order, the head's rows and slots, weights, per-row losses, the embedding
  // plan's segments (4 ints, about one per token) and combine entries (3 ints).
  b.per_micro_batch_inputs = T * 8 * 4 + (T + T / 32 + 2) * 16 + (2 * (T / 32) + 2) * 12;
  return b;
}

}  // namespace dlm::train
