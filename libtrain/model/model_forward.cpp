// The forward and backward passes of Model (the per-layer math is in model.h; each op's in backend.h).
#include <fmt/format.h>

#include "dlm/common/error.h"
#include "model_internal.h"

namespace dlm::train {

void Model::check_input(const ModelInput& in) const {
  const auto& c = config_;
  if (in.batch <= 0 || in.seq <= 0) fail(fmt::format("model input: batch {} x seq {} is empty", in.batch, in.seq));
  if (in.seq > c.max_position_embeddings)
    fail(fmt::format("model input: sequence length {} is longer than max_position_embeddings {}", in.seq,
                     c.max_position_embeddings));
  const auto n = static_cast<std::size_t>(in.batch * in.seq);
  if (in.ids.size() != n) fail(fmt::format("model input: {} ids for batch {} x seq {}", in.ids.size(), in.batch, in.seq));
  if (!in.positions.empty() && in.positions.size() != n)
    fail(fmt::format("model input: {} position ids for batch {} x seq {}", in.positions.size(), in.batch, in.seq));
  if (!in.key_valid.empty() && in.key_valid.size() != n)
    fail(fmt::format("model input: {} attention flags for batch {} x seq {}", in.key_valid.size(), in.batch, in.seq));
  for (std::size_t i = 0; i < n; ++i)
    if (in.ids[i] < 0 || in.ids[i] >= c.vocab_size)
      fail(fmt::format("model input: token id {} at position {} is outside the vocabulary of {}", in.ids[i], i,
                       c.vocab_size));
  for (std::size_t i = 0; i < in.positions.size(); ++i)
    if (in.positions[i] < 0 || in.positions[i] >= c.max_position_embeddings)
      fail(fmt::format("model input: position id {} at position {} is outside [0, max_position_embeddings {})",
                       in.positions[i], i, c.max_position_embeddings));
}

void Model::allocate_activations(std::int64_t batch, std::int64_t seq) {
  if (acts_ && acts_->batch == batch && acts_->seq == seq) return;
  acts_.reset();  // free the old shape's memory first
  auto a = std::make_shared<Activations>();
  a->batch = batch;
  a->seq = seq;
  const auto& c = config_;
  const std::int64_t n = batch * seq, h = c.hidden_size, heads = c.num_attention_heads, g = c.num_query_groups,
                     d = c.kv_channels, f = c.ffn_hidden_size, vp = c.padded_vocab_size();
  auto f32 = [&](std::vector<std::int64_t> shape) { return backend_.alloc(std::move(shape), DType::kF32); };
  a->ids = backend_.alloc({n}, DType::kI32);
  a->positions = backend_.alloc({n}, DType::kI32);
  a->labels = backend_.alloc({n}, DType::kI32);
  a->key_valid = backend_.alloc({batch, seq}, DType::kU8);
  a->weights = f32({n});
  for (int l = 0; l < c.num_layers; ++l) {
    Activations::Layer A;
    A.x = f32({n, h});
    A.xn1 = f32({n, h});
    A.rstd1 = f32({n});
    A.qkv = f32({n, c.q_size() + 2 * c.kv_size()});
    A.q = f32({n, heads, d});
    A.k = f32({n, g, d});
    A.v = f32({n, g, d});
    if (c.qk_layernorm) {
      A.qn = f32({n, heads, d});
      A.kn = f32({n, g, d});
      A.rstd_q = f32({n * heads});
      A.rstd_k = f32({n * g});
    }
    A.q_rope = f32({n, heads, d});
    A.k_rope = f32({n, g, d});
    A.attn = f32({n, heads * d});
    A.lse = f32({batch, heads, seq});
    A.h = f32({n, h});
    A.xn2 = f32({n, h});
    A.rstd2 = f32({n});
    A.gate_up = f32({n, 2 * f});
    A.act = f32({n, f});
    a->layers.push_back(std::move(A));
  }
  a->xf = f32({n, h});
  a->xnf = f32({n, h});
  a->rstdf = f32({n});
  a->logits = f32({n, vp});
  a->ce = f32({n});
  a->ce_lse = f32({n});
  acts_ = std::move(a);
}

// The output weight: the embedding table when tied.
static const Parameter& output_weight(const std::vector<Parameter>& params, bool tied) {
  return tied ? params.front() : params.back();
}

const Tensor& Model::forward(const ModelInput& in) {
  check_input(in);
  allocate_activations(in.batch, in.seq);
  Activations& a = *acts_;
  const auto& c = config_;
  const std::int64_t n = in.batch * in.seq, B = in.batch, L = in.seq;
  const std::int64_t heads = c.num_attention_heads, g = c.num_query_groups, d = c.kv_channels;
  Backend& be = backend_;
  a.attention = in.attention;
  a.has_ce = false;
  be.copy_from_host(a.ids, in.ids);
  if (in.positions.empty()) {
    std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) pos[i] = static_cast<std::int32_t>(i % L);
    be.copy_from_host(a.positions, std::span<const std::int32_t>(pos));
  } else {
    be.copy_from_host(a.positions, in.positions);
  }
  a.has_key_valid = !in.key_valid.empty();
  if (a.has_key_valid) be.copy_from_host(a.key_valid, in.key_valid);
  const Tensor no_mask;
  const Tensor& key_valid = a.has_key_valid ? a.key_valid : no_mask;

  be.embedding_forward(params_.front().value, a.ids, a.layers.front().x);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& P = layers_[l];
    auto& A = a.layers[l];
    be.rmsnorm_forward(A.x, params_[P.norm1].value, c.norm_epsilon, A.xn1, A.rstd1);
    be.linear_forward(A.xn1, params_[P.qkv].value, A.qkv);
    be.split_qkv_forward(A.qkv, A.q, A.k, A.v);
    Tensor q = A.q, k = A.k;
    if (c.qk_layernorm) {
      be.rmsnorm_forward(A.q, params_[P.q_norm].value, c.norm_epsilon, A.qn, A.rstd_q);
      be.rmsnorm_forward(A.k, params_[P.k_norm].value, c.norm_epsilon, A.kn, A.rstd_k);
      q = A.qn;
      k = A.kn;
    }
    be.rope_forward(q, a.positions, c.rotary_base, A.q_rope);
    be.rope_forward(k, a.positions, c.rotary_base, A.k_rope);
    be.attention_forward(A.q_rope.reshape({B, L, heads, d}), A.k_rope.reshape({B, L, g, d}), A.v.reshape({B, L, g, d}),
                         in.attention, key_valid, A.attn.reshape({B, L, heads, d}), A.lse);
    be.linear_forward(A.attn, params_[P.proj].value, A.h);
    be.add(A.h, A.x);
    be.rmsnorm_forward(A.h, params_[P.norm2].value, c.norm_epsilon, A.xn2, A.rstd2);
    be.linear_forward(A.xn2, params_[P.fc1].value, A.gate_up);
    be.swiglu_forward(A.gate_up, A.act);
    const Tensor& out = l + 1 < layers_.size() ? a.layers[l + 1].x : a.xf;
    be.linear_forward(A.act, params_[P.fc2].value, out);
    be.add(out, A.h);
  }
  const Parameter& final_norm = params_[c.tie_word_embeddings ? params_.size() - 1 : params_.size() - 2];
  be.rmsnorm_forward(a.xf, final_norm.value, c.norm_epsilon, a.xnf, a.rstdf);
  be.linear_forward(a.xnf, output_weight(params_, c.tie_word_embeddings).value, a.logits);
  return a.logits;
}

std::vector<float> Model::cross_entropy(std::span<const std::int32_t> labels) {
  if (!acts_) fail("model: cross_entropy() before forward()");
  Activations& a = *acts_;
  const std::int64_t n = a.batch * a.seq;
  if (static_cast<std::int64_t>(labels.size()) != n)
    fail(fmt::format("model: {} labels for {} positions", labels.size(), n));
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= config_.vocab_size)
      fail(fmt::format("model: label {} at position {} is outside the vocabulary of {}", labels[i], i,
                       config_.vocab_size));
  backend_.copy_from_host(a.labels, labels);
  backend_.cross_entropy_forward(a.logits, a.labels, config_.vocab_size, a.ce, a.ce_lse);
  std::vector<float> ce(static_cast<std::size_t>(n));
  backend_.copy_to_host(a.ce, ce);
  a.has_ce = true;
  return ce;
}

void Model::backward(std::span<const float> weights) {
  if (!acts_ || !acts_->has_ce) fail("model: backward() needs forward() and cross_entropy() first");
  Activations& a = *acts_;
  const auto& c = config_;
  const std::int64_t B = a.batch, L = a.seq, heads = c.num_attention_heads, g = c.num_query_groups, d = c.kv_channels;
  if (static_cast<std::int64_t>(weights.size()) != B * L)
    fail(fmt::format("model: {} loss weights for {} positions", weights.size(), B * L));
  Backend& be = backend_;
  if (!a.dx.defined()) {  // gradient scratch: first backward() of this shape (inference never pays for it)
    const std::int64_t n = B * L, h = c.hidden_size, f = c.ffn_hidden_size;
    auto f32 = [&](std::vector<std::int64_t> shape) { return be.alloc(std::move(shape), DType::kF32); };
    a.dx = f32({n, h});
    a.dtmp = f32({n, h});
    a.dxn = f32({n, h});
    a.dattn = f32({n, heads * d});
    a.dq = f32({n, heads, d});
    a.dk = f32({n, g, d});
    a.dv = f32({n, g, d});
    if (c.qk_layernorm) {
      a.dqn = f32({n, heads, d});
      a.dkn = f32({n, g, d});
    }
    a.dqkv = f32({n, c.q_size() + 2 * c.kv_size()});
    a.dact = f32({n, f});
    a.dgate_up = f32({n, 2 * f});
    a.dlogits = f32({n, c.padded_vocab_size()});
  }
  be.copy_from_host(a.weights, weights);
  const Tensor no_mask;
  const Tensor& key_valid = a.has_key_valid ? a.key_valid : no_mask;

  be.cross_entropy_backward(a.logits, a.labels, a.ce_lse, a.weights, c.vocab_size, a.dlogits);
  const Parameter& out_w = output_weight(params_, c.tie_word_embeddings);
  be.linear_backward(a.dlogits, a.xnf, out_w.value, a.dxn, out_w.grad);
  const Parameter& final_norm = params_[c.tie_word_embeddings ? params_.size() - 1 : params_.size() - 2];
  be.rmsnorm_backward(a.dxn, a.xf, final_norm.value, a.rstdf, a.dx, final_norm.grad);
  // a.dx is d loss / d (the residual stream) and walks down the layers.
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const Layer& P = layers_[l];
    auto& A = a.layers[l];
    be.linear_backward(a.dx, A.act, params_[P.fc2].value, a.dact, params_[P.fc2].grad);
    be.swiglu_backward(a.dact, A.gate_up, a.dgate_up);
    be.linear_backward(a.dgate_up, A.xn2, params_[P.fc1].value, a.dxn, params_[P.fc1].grad);
    be.rmsnorm_backward(a.dxn, A.h, params_[P.norm2].value, A.rstd2, a.dtmp, params_[P.norm2].grad);
    be.add(a.dx, a.dtmp);
    be.linear_backward(a.dx, A.attn, params_[P.proj].value, a.dattn, params_[P.proj].grad);
    be.attention_backward(a.dattn.reshape({B, L, heads, d}), A.q_rope.reshape({B, L, heads, d}),
                          A.k_rope.reshape({B, L, g, d}), A.v.reshape({B, L, g, d}), A.attn.reshape({B, L, heads, d}),
                          A.lse, a.attention, key_valid, a.dq.reshape({B, L, heads, d}), a.dk.reshape({B, L, g, d}),
                          a.dv.reshape({B, L, g, d}));
    be.rope_backward(a.dq, a.positions, c.rotary_base, a.dq);
    be.rope_backward(a.dk, a.positions, c.rotary_base, a.dk);
    Tensor dq = a.dq, dk = a.dk;
    if (c.qk_layernorm) {
      be.rmsnorm_backward(a.dq, A.q, params_[P.q_norm].value, A.rstd_q, a.dqn, params_[P.q_norm].grad);
      be.rmsnorm_backward(a.dk, A.k, params_[P.k_norm].value, A.rstd_k, a.dkn, params_[P.k_norm].grad);
      dq = a.dqn;
      dk = a.dkn;
    }
    be.split_qkv_backward(dq, dk, a.dv, a.dqkv);
    be.linear_backward(a.dqkv, A.xn1, params_[P.qkv].value, a.dxn, params_[P.qkv].grad);
    be.rmsnorm_backward(a.dxn, A.x, params_[P.norm1].value, A.rstd1, a.dtmp, params_[P.norm1].grad);
    be.add(a.dx, a.dtmp);
  }
  be.embedding_backward(a.dx, a.ids, params_.front().grad);
}

}  // namespace dlm::train
