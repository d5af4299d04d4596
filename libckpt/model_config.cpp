#include "dlm/ckpt/model_config.h"

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::ckpt {

std::int64_t ModelConfig::padded_vocab_size() const {
  std::int64_t d = make_vocab_size_divisible_by > 0 ? make_vocab_size_divisible_by : 1;
  return (vocab_size + d - 1) / d * d;
}

bool ModelConfig::is_moe_layer(int layer) const {
  if (num_experts <= 0) return false;
  if (!moe_layer_pattern.empty()) return moe_layer_pattern.at(static_cast<std::size_t>(layer)) != 0;
  return layer % moe_layer_freq == 0;
}

void ModelConfig::validate() const {
  auto positive = [](const char* name, std::int64_t v) {
    if (v <= 0) fail(fmt::format("invalid model config: {} must be positive, got {}", name, v));
  };
  positive("num_layers", num_layers);
  positive("hidden_size", hidden_size);
  positive("ffn_hidden_size", ffn_hidden_size);
  positive("num_attention_heads", num_attention_heads);
  positive("num_query_groups", num_query_groups);
  positive("kv_channels", kv_channels);
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  if (num_attention_heads % num_query_groups != 0) {
    fail(fmt::format("invalid model config: num_query_groups {} does not divide num_attention_heads {}",
                     num_query_groups, num_attention_heads));
  }
  if (kv_channels % 2 != 0) fail(fmt::format("invalid model config: kv_channels {} must be even for RoPE", kv_channels));
  if (!(rotary_base > 0)) fail("invalid model config: rotary_base must be positive");
  if (!(norm_epsilon > 0)) fail("invalid model config: norm_epsilon must be positive");
  auto check_id = [&](const char* name, const std::optional<std::int32_t>& id) {
    if (id && (*id < 0 || *id >= vocab_size)) {
      fail(fmt::format("invalid model config: {} {} is outside the vocabulary of {}", name, *id, vocab_size));
    }
  };
  check_id("mask_token_id", mask_token_id);
  check_id("bos_token_id", bos_token_id);
  check_id("eos_token_id", eos_token_id);
  check_id("pad_token_id", pad_token_id);
  if (num_experts < 0) fail(fmt::format("invalid model config: num_experts must not be negative, got {}", num_experts));
  if (num_experts > 0) {
    positive("moe_router_topk", moe_router_topk);
    positive("moe_ffn_hidden_size", moe_ffn_hidden_size);
    positive("moe_layer_freq", moe_layer_freq);
    if (moe_router_topk > num_experts)
      fail(fmt::format("invalid model config: moe_router_topk {} is more than num_experts {}", moe_router_topk, num_experts));
    if (moe_shared_expert_intermediate_size < 0)
      fail("invalid model config: moe_shared_expert_intermediate_size must not be negative");
    if (!moe_layer_pattern.empty() && static_cast<int>(moe_layer_pattern.size()) != num_layers)
      fail(fmt::format("invalid model config: moe_layer_pattern has {} entries for {} layers", moe_layer_pattern.size(),
                       num_layers));
    for (int v : moe_layer_pattern)
      if (v != 0 && v != 1) fail(fmt::format("invalid model config: moe_layer_pattern entry {} (expected 0 or 1)", v));
    if (!(moe_aux_loss_coeff >= 0) || !(moe_z_loss_coeff >= 0))
      fail("invalid model config: moe_aux_loss_coeff and moe_z_loss_coeff must not be negative");
    if (!(moe_expert_capacity_factor >= 0) || moe_expert_capacity_factor > 1e6)
      fail(fmt::format("invalid model config: moe_expert_capacity_factor {} (expected 0 for dropless, or positive)",
                       moe_expert_capacity_factor));
  }
}

std::vector<TensorSpec> model_tensors(const ModelConfig& c) {
  const std::int64_t h = c.hidden_size, v = c.padded_vocab_size(), f = c.ffn_hidden_size, d = c.kv_channels;
  std::vector<TensorSpec> out;
  out.push_back({"embedding.word_embeddings.weight", {v, h}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = fmt::format("decoder.layers.{}.", i);
    out.push_back({p + "self_attention.linear_qkv.layer_norm_weight", {h}, true});
    out.push_back({p + "self_attention.linear_qkv.weight", {c.q_size() + 2 * c.kv_size(), h}});
    if (c.qk_layernorm) {
      out.push_back({p + "self_attention.q_layernorm.weight", {d}, true});
      out.push_back({p + "self_attention.k_layernorm.weight", {d}, true});
    }
    out.push_back({p + "self_attention.linear_proj.weight", {h, c.q_size()}});
    if (c.is_moe_layer(i)) {
      const std::int64_t e = c.num_experts, mf = c.moe_ffn_hidden_size;
      out.push_back({p + "pre_mlp_layernorm.weight", {h}, true});
      out.push_back({p + "mlp.router.weight", {e, h}});
      out.push_back({p + "mlp.experts.linear_fc1.weight", {e, 2 * mf, h}});
      out.push_back({p + "mlp.experts.linear_fc2.weight", {e, h, mf}});
      if (const std::int64_t s = c.moe_shared_expert_intermediate_size; s > 0) {
        out.push_back({p + "mlp.shared_experts.linear_fc1.weight", {2 * s, h}});
        out.push_back({p + "mlp.shared_experts.linear_fc2.weight", {h, s}});
      }
      continue;
    }
    out.push_back({p + "mlp.linear_fc1.layer_norm_weight", {h}, true});
    out.push_back({p + "mlp.linear_fc1.weight", {2 * f, h}});
    out.push_back({p + "mlp.linear_fc2.weight", {h, f}});
  }
  out.push_back({"decoder.final_layernorm.weight", {h}, true});
  if (!c.tie_word_embeddings) out.push_back({"output_layer.weight", {v, h}});
  return out;
}

}  // namespace dlm::ckpt
