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

void Model::use_slot(int slot) {
  if (slot < 0) fail(fmt::format("model: activation slot {} is negative", slot));
  if (static_cast<std::size_t>(slot) >= slots_.size()) slots_.resize(static_cast<std::size_t>(slot) + 1);
  slots_[static_cast<std::size_t>(slot_)] = acts_;
  slot_ = slot;
  acts_ = slots_[static_cast<std::size_t>(slot)];
}

void Model::allocate_activations(std::int64_t batch, std::int64_t seq) {
  if (acts_ && acts_->batch == batch && acts_->seq == seq) return;
  acts_.reset();  // free the old shape's memory first
  slots_[static_cast<std::size_t>(slot_)].reset();
  auto a = std::make_shared<Activations>();
  a->batch = batch;
  a->seq = seq;
  const auto& c = config_;
  const std::int64_t tp = shard_.layout.tp, n = batch * seq, h = c.hidden_size, heads = c.num_attention_heads / tp,
                     g = c.num_query_groups / tp, d = c.kv_channels, f = c.ffn_hidden_size / tp,
                     vp = c.padded_vocab_size() / tp;
  const std::int64_t nl = local_rows(n);
  if (nl * tp != n && shard_.sequence_parallel)
    fail(fmt::format("model input: sequence parallelism splits the batch x seq = {} tokens over {} tensor ranks: "
                     "it must divide them", n, tp));
  const bool sp = shard_.sequence_parallel;
  auto f32 = [&](std::vector<std::int64_t> shape) { return backend_.alloc(std::move(shape), DType::kF32); };
  a->ids = backend_.alloc({n}, DType::kI32);
  a->positions = backend_.alloc({n}, DType::kI32);
  a->labels = backend_.alloc({n}, DType::kI32);
  if (tp > 1) a->labels_local = backend_.alloc({n}, DType::kI32);
  a->key_valid = backend_.alloc({batch, seq}, DType::kU8);
  a->weights = f32({n});
  if (sp) a->partial = f32({n, h});
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    Activations::Layer A;
    A.x = f32({nl, h});
    A.xn1 = f32({nl, h});
    if (sp) A.xn1g = f32({n, h});
    A.rstd1 = f32({nl});
    A.qkv = f32({n, (c.q_size() + 2 * c.kv_size()) / tp});
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
    A.h = f32({nl, h});
    A.xn2 = f32({nl, h});
    if (sp) A.xn2g = f32({n, h});
    A.rstd2 = f32({nl});
    if (layers_[l].moe()) {
      const std::int64_t k = c.moe_router_topk, mf = c.moe_ffn_hidden_size / tp;
      A.router_logits = f32({n, c.num_experts});
      A.moe_experts = backend_.alloc({n, k}, DType::kI32);
      A.moe_weights = f32({n, k});
      A.gate_up = f32({n * k, 2 * mf});
      A.act = f32({n * k, mf});
      if (const std::int64_t s = c.moe_shared_expert_intermediate_size / tp; s > 0) {
        A.shared_gate_up = f32({n, 2 * s});
        A.shared_act = f32({n, s});
      }
    } else {
      A.gate_up = f32({n, 2 * f});
      A.act = f32({n, f});
    }
    a->layers.push_back(std::move(A));
  }
  a->xf = f32({nl, h});
  if (c.num_experts > 0 && c.moe_shared_expert_intermediate_size > 0) a->shared_out = f32({n, h});
  if (post_process()) {
    a->xnf = f32({nl, h});
    if (sp) a->xnfg = f32({n, h});
    a->rstdf = f32({nl});
    a->logits = f32({n, vp});
    a->ce = f32({n});
    a->ce_lse = f32({n});
  }
  acts_ = std::move(a);
  slots_[static_cast<std::size_t>(slot_)] = acts_;
}

const Tensor& Model::forward(const ModelInput& in) { return forward_pass(in, false, -1); }

const Tensor& Model::forward_pass(const ModelInput& in, bool store, std::int64_t window_first) {
  check_input(in);
  allocate_activations(in.batch, in.seq);
  Activations& a = *acts_;
  const auto& c = config_;
  const std::int64_t tp = shard_.layout.tp, n = in.batch * in.seq, B = in.batch, L = in.seq;
  const std::int64_t heads = c.num_attention_heads / tp, g = c.num_query_groups / tp, d = c.kv_channels;
  Backend& be = backend_;
  a.attention = in.attention;
  a.has_ce = false;
  if (in.positions.empty()) {
    std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) pos[i] = static_cast<std::int32_t>(i % L);
    be.copy_from_host(a.positions, std::span<const std::int32_t>(pos));
  } else {
    be.copy_from_host(a.positions, in.positions);
  }
  a.has_key_valid = !in.key_valid.empty();
  if (a.has_key_valid) be.copy_from_host(a.key_valid, in.key_valid);
  a.routed_rows.clear();
  if (a.has_key_valid && shard_.sequence_parallel && c.num_experts > 0)
    for (std::int64_t i = 0; i < n; ++i)
      if (in.key_valid[static_cast<std::size_t>(i)]) a.routed_rows.push_back(i);
  const Tensor no_mask;
  const Tensor& key_valid = a.has_key_valid ? a.key_valid : no_mask;

  const Tensor& first_x = a.layers.empty() ? a.xf : a.layers.front().x;
  if (pre_process()) {
    if (tp > 1) {  // vocab-parallel: this rank's rows of the table, zero rows for the others' ids
      std::vector<std::int32_t> local;
      vocab_parallel_ids(in.ids, local);
      be.copy_from_host(a.ids, std::span<const std::int32_t>(local));
    } else {
      be.copy_from_host(a.ids, in.ids);
    }
    const Tensor& partial = shard_.sequence_parallel ? a.partial : first_x;
    be.embedding_forward(params_[embedding_].value, a.ids, partial);
    row_output(partial, first_x);
  } else {
    if (static_cast<std::int64_t>(in.input_hidden.size()) != first_x.numel())
      fail(fmt::format("model: a pipeline chunk got {} input hidden values for a [{} x {}] input", in.input_hidden.size(),
                       first_x.dim(0), first_x.dim(1)));
    be.copy_from_host(first_x, in.input_hidden);
  }
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& P = layers_[l];
    auto& A = a.layers[l];
    be.rmsnorm_forward(A.x, params_[P.norm1].value, c.norm_epsilon, A.xn1, A.rstd1);
    be.linear_forward(column_input(A.xn1, A.xn1g), params_[P.qkv].value, A.qkv);
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
    if (store) store_kv(l, A.k_rope, A.v);
    if (window_first >= 0) {
      const KvStore& kv = window_kv(l, A.k_rope, A.v, window_first);
      be.attention_forward(A.q_rope.reshape({B, L, heads, d}), kv.k_all, kv.v_all, in.attention,
                           kv.has_key_valid ? kv.key_valid : no_mask, A.attn.reshape({B, L, heads, d}), A.lse);
    } else {
      be.attention_forward(A.q_rope.reshape({B, L, heads, d}), A.k_rope.reshape({B, L, g, d}),
                           A.v.reshape({B, L, g, d}), in.attention, key_valid, A.attn.reshape({B, L, heads, d}), A.lse);
    }
    const Tensor& proj_out = shard_.sequence_parallel ? a.partial : A.h;
    be.linear_forward(A.attn, params_[P.proj].value, proj_out);
    row_output(proj_out, A.h);
    be.add(A.h, A.x);
    be.rmsnorm_forward(A.h, params_[P.norm2].value, c.norm_epsilon, A.xn2, A.rstd2);
    const Tensor& out = l + 1 < layers_.size() ? a.layers[l + 1].x : a.xf;
    if (P.moe()) {
      moe_forward(l, out);
      be.add(out, A.h);
      continue;
    }
    be.linear_forward(column_input(A.xn2, A.xn2g), params_[P.fc1].value, A.gate_up);
    be.swiglu_forward(A.gate_up, A.act);
    const Tensor& fc2_out = shard_.sequence_parallel ? a.partial : out;
    be.linear_forward(A.act, params_[P.fc2].value, fc2_out);
    row_output(fc2_out, out);
    be.add(out, A.h);
  }
  if (!post_process()) return a.xf;
  be.rmsnorm_forward(a.xf, params_[final_norm_].value, c.norm_epsilon, a.xnf, a.rstdf);
  be.linear_forward(column_input(a.xnf, a.xnfg), params_[output_].value, a.logits);
  return a.logits;
}

std::vector<float> Model::cross_entropy(std::span<const std::int32_t> labels) {
  if (!acts_) fail("model: cross_entropy() before forward()");
  if (!post_process()) fail("model: cross_entropy() on a pipeline chunk without the output layer");
  Activations& a = *acts_;
  const std::int64_t n = a.batch * a.seq;
  if (static_cast<std::int64_t>(labels.size()) != n)
    fail(fmt::format("model: {} labels for {} positions", labels.size(), n));
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= config_.vocab_size)
      fail(fmt::format("model: label {} at position {} is outside the vocabulary of {}", labels[i], i,
                       config_.vocab_size));
  backend_.copy_from_host(a.labels, labels);
  std::vector<float> ce(static_cast<std::size_t>(n));
  if (shard_.layout.tp > 1) {
    ce = vocab_parallel_cross_entropy(labels);
  } else {
    backend_.cross_entropy_forward(a.logits, a.labels, config_.vocab_size, a.ce, a.ce_lse);
    backend_.copy_to_host(a.ce, ce);
  }
  a.has_ce = true;
  return ce;
}

}  // namespace dlm::train
