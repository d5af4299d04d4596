// The backward pass of Model: from the loss (or, on a pipeline chunk without the head, from the gradient
// of its output hidden states) down the layers to the embedding (or to input_gradient()). Each op's
// math is in backend.h; the tensor-parallel collectives are the transposes of the forward's
// (model.h's header comment, model_tensor_parallel.cpp).
#include <algorithm>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "model_internal.h"

namespace dlm::train {

void Model::allocate_gradients() {
  Activations& a = *acts_;
  if (a.dx.defined()) return;  // first backward() of this shape (inference never pays for it)
  const auto& c = config_;
  const std::int64_t tp = shard_.layout.tp, n = a.batch * a.seq, nl = local_rows(n), h = c.hidden_size,
                     heads = c.num_attention_heads / tp, g = c.num_query_groups / tp, d = c.kv_channels,
                     f = c.ffn_hidden_size / tp;
  auto f32 = [&](std::vector<std::int64_t> shape) { return backend_.alloc(std::move(shape), DType::kF32); };
  a.dx = f32({nl, h});
  a.dtmp = f32({nl, h});
  a.dxn = f32({nl, h});
  a.dxn_full = shard_.sequence_parallel ? f32({n, h}) : a.dxn;
  a.dfull = shard_.sequence_parallel ? f32({n, h}) : a.dx;
  a.dattn = f32({n, heads * d});
  a.dq = f32({n, heads, d});
  a.dk = f32({n, g, d});
  a.dv = f32({n, g, d});
  if (c.qk_layernorm) {
    a.dqn = f32({n, heads, d});
    a.dkn = f32({n, g, d});
  }
  a.dqkv = f32({n, (c.q_size() + 2 * c.kv_size()) / tp});
  a.dact = f32({n, f});
  a.dgate_up = f32({n, 2 * f});
  if (post_process()) a.dlogits = f32({n, c.padded_vocab_size() / tp});
  if (c.num_experts > 0) {
    a.drouter_logits = f32({n, c.num_experts});
    a.dmoe_weights = f32({n, c.moe_router_topk});
    a.dtmp_full = shard_.sequence_parallel ? f32({n, h}) : a.dtmp;
    if (const std::int64_t s = c.moe_shared_expert_intermediate_size / tp; s > 0) {
      a.dshared_act = f32({n, s});
      a.dshared_gate_up = f32({n, 2 * s});
    }
  }
}

void Model::backward(std::span<const float> weights, double router_loss_weight) {
  router_loss_weight_ = router_loss_weight;
  if (!acts_ || !acts_->has_ce) fail("model: backward() needs forward() and cross_entropy() first");
  Activations& a = *acts_;
  const auto& c = config_;
  if (static_cast<std::int64_t>(weights.size()) != a.batch * a.seq)
    fail(fmt::format("model: {} loss weights for {} positions", weights.size(), a.batch * a.seq));
  allocate_gradients();
  Backend& be = backend_;
  be.copy_from_host(a.weights, weights);
  // Vocab-parallel: ce_lse holds the lse over the whole vocabulary and the rank's columns start at
  // vocab_begin_, so each rank writes its own columns of softmax - onehot.
  const std::int64_t real_columns =
      std::clamp<std::int64_t>(c.vocab_size - vocab_begin_, 0, c.padded_vocab_size() / shard_.layout.tp);
  be.cross_entropy_backward_shard(a.logits, a.labels, vocab_begin_, a.ce_lse, a.weights, real_columns, a.dlogits);
  const Parameter& out_w = params_[output_];
  be.linear_backward(a.dlogits, gathered(a.xnf, a.xnfg), out_w.value, a.dxn_full, out_w.grad);
  column_input_backward(a.dxn_full, a.dxn);
  const Parameter& final_norm = params_[final_norm_];
  be.rmsnorm_backward(a.dxn, a.xf, final_norm.value, a.rstdf, a.dx, final_norm.grad);
  gradient_done(final_norm_);
  if (output_ != embedding_) gradient_done(output_);  // a tied table gets its last part in the embedding's backward
  backward_layers();
}

void Model::backward_from_output(std::span<const float> d_output, double router_loss_weight) {
  router_loss_weight_ = router_loss_weight;
  if (post_process()) fail("model: backward_from_output() on the chunk that holds the output layer");
  if (!acts_) fail("model: backward_from_output() before forward()");
  allocate_gradients();
  if (static_cast<std::int64_t>(d_output.size()) != acts_->dx.numel())
    fail(fmt::format("model: {} output gradient values for [{} x {}] hidden states", d_output.size(),
                     acts_->dx.dim(0), acts_->dx.dim(1)));
  backend_.copy_from_host(acts_->dx, d_output);
  backward_layers();
}

std::vector<float> Model::input_gradient() const {
  if (pre_process()) fail("model: input_gradient() on the chunk that holds the embedding");
  if (!acts_ || !acts_->dx.defined()) fail("model: input_gradient() before backward()");
  std::vector<float> out(static_cast<std::size_t>(acts_->dx.numel()));
  backend_.copy_to_host(acts_->dx, out);
  return out;
}

// a.dx is d loss / d (the residual stream after the chunk's last layer) and walks down the layers.
void Model::backward_layers() {
  Activations& a = *acts_;
  const auto& c = config_;
  const std::int64_t tp = shard_.layout.tp, B = a.batch, L = a.seq, heads = c.num_attention_heads / tp,
                     g = c.num_query_groups / tp, d = c.kv_channels;
  Backend& be = backend_;
  const Tensor no_mask;
  const Tensor& key_valid = a.has_key_valid ? a.key_valid : no_mask;
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const Layer& P = layers_[l];
    auto& A = a.layers[l];
    if (P.moe()) {
      moe_backward(l);
    } else {
      row_output_backward(a.dx, a.dfull);
      be.linear_backward(a.dfull, A.act, params_[P.fc2].value, a.dact, params_[P.fc2].grad);
      be.swiglu_backward(a.dact, A.gate_up, a.dgate_up);
      be.linear_backward(a.dgate_up, gathered(A.xn2, A.xn2g), params_[P.fc1].value, a.dxn_full, params_[P.fc1].grad);
      column_input_backward(a.dxn_full, a.dxn);
    }
    be.rmsnorm_backward(a.dxn, A.h, params_[P.norm2].value, A.rstd2, a.dtmp, params_[P.norm2].grad);
    be.add(a.dx, a.dtmp);
    row_output_backward(a.dx, a.dfull);
    be.linear_backward(a.dfull, A.attn, params_[P.proj].value, a.dattn, params_[P.proj].grad);
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
    be.linear_backward(a.dqkv, gathered(A.xn1, A.xn1g), params_[P.qkv].value, a.dxn_full, params_[P.qkv].grad);
    column_input_backward(a.dxn_full, a.dxn);
    be.rmsnorm_backward(a.dxn, A.x, params_[P.norm1].value, A.rstd1, a.dtmp, params_[P.norm1].grad);
    be.add(a.dx, a.dtmp);
    for (int param : {P.fc2, P.fc1, P.experts_fc2, P.experts_fc1, P.router, P.norm2, P.proj, P.q_norm, P.k_norm, P.qkv,
                      P.norm1})
      gradient_done(param);
  }
  if (pre_process()) {
    // The embedding's output was reduced over the tensor group: its gradient reaches every rank whole.
    row_output_backward(a.dx, a.dfull);
    be.embedding_backward(a.dfull, a.ids, params_[embedding_].grad);
    gradient_done(embedding_);
  }
}

}  // namespace dlm::train
