// ModelConfig <-> dlm's own JSON (a checkpoint's metadata.json "model" object).
#include <set>

#include "dlm/ckpt/model_config.h"
#include "json_fields.h"

namespace dlm::ckpt {

using detail::json;
using detail::read_field;
using detail::read_optional;

std::string model_config_to_json(const ModelConfig& c) {
  json j = {{"num_layers", c.num_layers},
            {"hidden_size", c.hidden_size},
            {"ffn_hidden_size", c.ffn_hidden_size},
            {"num_attention_heads", c.num_attention_heads},
            {"num_query_groups", c.num_query_groups},
            {"kv_channels", c.kv_channels},
            {"vocab_size", c.vocab_size},
            {"make_vocab_size_divisible_by", c.make_vocab_size_divisible_by},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rotary_base", c.rotary_base},
            {"norm_epsilon", c.norm_epsilon},
            {"qk_layernorm", c.qk_layernorm},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"attention_mask", c.attention_mask == AttentionMask::kCausal ? "causal" : "bidirectional"},
            {"init_method_std", c.init_method_std}};
  auto id = [&](const char* key, const std::optional<std::int32_t>& v) {
    if (v) j[key] = *v;
  };
  id("mask_token_id", c.mask_token_id);
  id("bos_token_id", c.bos_token_id);
  id("eos_token_id", c.eos_token_id);
  id("pad_token_id", c.pad_token_id);
  if (c.num_experts > 0) {  // dense models keep the metadata they always had
    j["num_experts"] = c.num_experts;
    j["moe_router_topk"] = c.moe_router_topk;
    j["moe_ffn_hidden_size"] = c.moe_ffn_hidden_size;
    j["moe_shared_expert_intermediate_size"] = c.moe_shared_expert_intermediate_size;
    j["moe_layer_freq"] = c.moe_layer_freq;
    if (!c.moe_layer_pattern.empty()) j["moe_layer_pattern"] = c.moe_layer_pattern;
    j["moe_router_score_function"] = c.moe_router_score_function == MoeScoreFunction::kSigmoid ? "sigmoid" : "softmax";
    j["moe_norm_topk_prob"] = c.moe_norm_topk_prob;
    j["moe_aux_loss_coeff"] = c.moe_aux_loss_coeff;
    j["moe_z_loss_coeff"] = c.moe_z_loss_coeff;
    if (c.moe_expert_capacity_factor > 0) {  // dropless models keep the metadata they had
      j["moe_expert_capacity_factor"] = c.moe_expert_capacity_factor;
      j["moe_token_drop_policy"] = c.moe_token_drop_policy == MoeDropPolicy::kPosition ? "position" : "probs";
    }
  }
  if (!c.hf_architecture.empty()) j["hf_architecture"] = c.hf_architecture;
  if (!c.hf_extra_json.empty()) j["hf_extra"] = json::parse(c.hf_extra_json);
  return j.dump();
}

namespace {

// A field that names one of two choices (absent: `out` stays); another word is an error naming both.
template <typename E>
void read_choice(const json& j, const char* key, const std::pair<const char*, E> (&choices)[2], E& out,
                 const std::string& file) {
  std::string word;
  if (!read_field(j, key, word, file)) return;
  for (const auto& [name, value] : choices)
    if (word == name) {
      out = value;
      return;
    }
  fail_at(file, fmt::format("model config: {} '{}' (expected {} or {})", key, word, choices[0].first, choices[1].first));
}

}  // namespace

ModelConfig model_config_from_json(std::string_view text, const std::string& file) {
  const json j = detail::parse_json(text, file);
  if (!j.is_object()) fail_at(file, "model config must be a JSON object");
  static const std::set<std::string> known = {
      "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
      "vocab_size", "make_vocab_size_divisible_by", "max_position_embeddings", "rotary_base", "norm_epsilon",
      "qk_layernorm", "tie_word_embeddings", "attention_mask", "init_method_std", "mask_token_id", "bos_token_id",
      "eos_token_id", "pad_token_id", "hf_architecture", "hf_extra", "num_experts", "moe_router_topk",
      "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq", "moe_layer_pattern",
      "moe_router_score_function", "moe_norm_topk_prob", "moe_aux_loss_coeff", "moe_z_loss_coeff",
      "moe_expert_capacity_factor", "moe_token_drop_policy"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) fail_at(file, fmt::format("model config: unknown field '{}'", it.key()));
  ModelConfig c;
  for (const char* key : {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                          "kv_channels", "vocab_size", "max_position_embeddings"})
    if (!j.contains(key)) fail_at(file, fmt::format("model config: missing field '{}'", key));
  read_field(j, "num_layers", c.num_layers, file);
  read_field(j, "hidden_size", c.hidden_size, file);
  read_field(j, "ffn_hidden_size", c.ffn_hidden_size, file);
  read_field(j, "num_attention_heads", c.num_attention_heads, file);
  read_field(j, "num_query_groups", c.num_query_groups, file);
  read_field(j, "kv_channels", c.kv_channels, file);
  read_field(j, "vocab_size", c.vocab_size, file);
  read_field(j, "make_vocab_size_divisible_by", c.make_vocab_size_divisible_by, file);
  read_field(j, "max_position_embeddings", c.max_position_embeddings, file);
  read_field(j, "rotary_base", c.rotary_base, file);
  read_field(j, "norm_epsilon", c.norm_epsilon, file);
  read_field(j, "qk_layernorm", c.qk_layernorm, file);
  read_field(j, "tie_word_embeddings", c.tie_word_embeddings, file);
  read_field(j, "init_method_std", c.init_method_std, file);
  read_choice(j, "attention_mask", {{"bidirectional", AttentionMask::kBidirectional}, {"causal", AttentionMask::kCausal}},
              c.attention_mask, file);
  read_optional(j, "mask_token_id", c.mask_token_id, file);
  read_optional(j, "bos_token_id", c.bos_token_id, file);
  read_optional(j, "eos_token_id", c.eos_token_id, file);
  read_optional(j, "pad_token_id", c.pad_token_id, file);
  read_field(j, "hf_architecture", c.hf_architecture, file);
  read_field(j, "num_experts", c.num_experts, file);
  read_field(j, "moe_router_topk", c.moe_router_topk, file);
  read_field(j, "moe_ffn_hidden_size", c.moe_ffn_hidden_size, file);
  read_field(j, "moe_shared_expert_intermediate_size", c.moe_shared_expert_intermediate_size, file);
  read_field(j, "moe_layer_freq", c.moe_layer_freq, file);
  detail::read_int_list(j, "moe_layer_pattern", c.moe_layer_pattern, file);
  read_choice(j, "moe_router_score_function",
              {{"softmax", MoeScoreFunction::kSoftmax}, {"sigmoid", MoeScoreFunction::kSigmoid}},
              c.moe_router_score_function, file);
  read_field(j, "moe_norm_topk_prob", c.moe_norm_topk_prob, file);
  read_field(j, "moe_aux_loss_coeff", c.moe_aux_loss_coeff, file);
  read_field(j, "moe_z_loss_coeff", c.moe_z_loss_coeff, file);
  read_field(j, "moe_expert_capacity_factor", c.moe_expert_capacity_factor, file);
  read_choice(j, "moe_token_drop_policy", {{"probs", MoeDropPolicy::kProbs}, {"position", MoeDropPolicy::kPosition}},
              c.moe_token_drop_policy, file);
  if (auto it = j.find("hf_extra"); it != j.end()) {
    if (!it->is_object()) fail_at(file, "model config: 'hf_extra' must be an object");
    c.hf_extra_json = it->dump();
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail_at(file, e.message());
  }
  return c;
}

}  // namespace dlm::ckpt
