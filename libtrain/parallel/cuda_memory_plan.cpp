// The CUDA backend's activation layout and the dry run's bytes from it (include/dlm/train/cuda_memory_plan.h).
// CudaModel allocates exactly these buffers (libtrain/backend/cuda/activations.h), so the plan follows any change.
#include "dlm/train/cuda_memory_plan.h"

#include <algorithm>

#include "dlm/train/fp8.h"

namespace dlm::train {

CudaFp8Bytes cuda_fp8_bytes(const ckpt::ModelConfig& c, std::int64_t tokens, int tensor) {
  const std::int64_t d = c.hidden_size, heads = c.num_attention_heads / tensor, groups = c.num_query_groups / tensor;
  const std::int64_t q = heads * c.kv_channels, qkv = (heads + 2 * groups) * c.kv_channels;
  const std::int64_t ffn = c.ffn_hidden_size / tensor;
  const std::int64_t widest_in = std::max({d, q, ffn}), widest_out = std::max({qkv, d, 2 * ffn});
  // The transposed operands hold the rows padded to 16.
  return {2.0 * static_cast<double>(qkv * d + d * q + 2 * ffn * d + d * ffn),
          static_cast<double>(fp8_padded_rows(tokens)) * static_cast<double>(widest_in + 2 * widest_out)};
}

CudaActivationLayout cuda_activation_layout(const ckpt::ModelConfig& c, std::int64_t tokens, int tensor,
                                            bool sequence_parallel, bool pre, bool post) {
  const bool sp = sequence_parallel && tensor > 1;
  const std::int64_t T = tokens, Ts = sp ? T / tensor : T, d = c.hidden_size;
  const std::int64_t heads = c.num_attention_heads / tensor, groups = c.num_query_groups / tensor;
  const std::int64_t q = heads * c.kv_channels, qkv = (heads + 2 * groups) * c.kv_channels;
  const std::int64_t ffn = c.ffn_hidden_size / tensor, vpad = c.padded_vocab_size() / tensor;
  CudaActivationLayout L;
  L.tokens = T, L.rows = Ts;
  L.chunk = std::min(T, std::max<std::int64_t>(64, kCudaLogitsBudget / (2 * vpad) / 64 * 64));
  // LayerActs: the residual stream entering each norm and the rstds hold the rank's rows; the GEMMs' normed
  // inputs every row, gathered.
  CudaLayerActsLayout& a = L.layer;
  a.res1 = Ts * d, a.h1 = T * d, a.qkv_raw = T * qkv, a.qkv_rot = T * qkv, a.att = T * q, a.res2 = Ts * d;
  // act: at least 8 rows, so that FP8 training's fc2 x^T [ffn, T padded to 16] fits in its bytes (fp8_linear.h).
  a.h2 = T * d, a.gu = T * 2 * ffn, a.act = std::max<std::int64_t>(T, 8) * ffn;
  a.rstd1 = Ts, a.qk_rstd = T * (heads + groups), a.lse = T * heads, a.rstd2 = Ts;
  // The shared buffers. Under SP the *_full ones hold every row; otherwise they are their local buffer.
  CudaSharedActsLayout& s = L.shared;
  s.tmp = s.res_f = s.dres16 = s.dh = Ts * d;
  s.hf = T * d, s.logits = L.chunk * vpad, s.dact = T * ffn;
  if (sp) s.tmp_full = T * d, s.hloc = Ts * d, s.dres16_full = T * d, s.dh_full = T * d;
  if (!post) s.stage_out = Ts * d, s.dres_in = Ts * d;
  s.dgu = T * 2 * ffn, s.datt = T * q, s.dqkv_rot = T * qkv, s.dqkv = T * qkv;
  // The head's packed rows live in dgu, which only the layers' backward uses, when it can hold them.
  if (post && 2 * ffn < d) s.head_x = T * d;
  s.rstd_f = Ts, s.dres = Ts * d, s.delta = T * heads;
  if (sp && pre) s.dres_full = T * d;
  if (tensor > 1) s.ce_lse = tensor * L.chunk, s.ce_label = L.chunk;  // the vocabulary-parallel CE's statistics
  s.emb_partial = cuda_embedding_slots(T) * d;
  if (post) L.head = {Ts * d, T * d, Ts};
  L.inputs = {T, cuda_embedding_segments(T), cuda_embedding_slots(T)};
  return L;
}

CudaActivationBytes cuda_activation_bytes(const ckpt::ModelConfig& c, std::int64_t tokens, int tensor,
                                          bool sequence_parallel, bool pre, bool post, bool recompute) {
  const CudaActivationLayout L = cuda_activation_layout(c, tokens, tensor, sequence_parallel, pre, post);
  CudaActivationBytes b;
  // Recomputing, a slot's layer holds its input and the rest is one layer's worth, shared.
  const auto input = static_cast<double>(L.layer.input_bytes()), rest = static_cast<double>(L.layer.rest_bytes());
  b.per_layer_slot = recompute ? input : input + rest;
  b.shared = static_cast<double>(L.shared.bytes()) + (recompute ? rest : 0.0);
  b.per_extra_head_slot = static_cast<double>(L.head.bytes());
  b.per_micro_batch_inputs = static_cast<double>(L.inputs.bytes());
  return b;
}

}  // namespace dlm::train
