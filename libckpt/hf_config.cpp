// Hugging Face config.json <-> ModelConfig.
#include <algorithm>
#include <set>

#include "dlm/ckpt/hf.h"
#include "json_fields.h"

namespace dlm::ckpt {

using detail::json;
using detail::read_field;

namespace {

// The fields this file models; everything else of config.json goes to hf_extra_json untouched.
const std::set<std::string>& modeled_fields() {
  static const std::set<std::string> s = {
      "architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
      "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps",
      "tie_word_embeddings", "initializer_range", "mask_token_id", "attn_mask_type", "torch_dtype",
      "attention_bias", "mlp_bias", "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
      "norm_topk_prob", "router_aux_loss_coef", "decoder_sparse_step", "mlp_only_layers"};
  return s;
}

bool has_qk_norm(const std::string& arch, const json& j, const std::string& file) {
  // read_field checks the type: a model_type that is not a string crashed json::value (model_config_fuzz).
  std::string type;
  read_field(j, "model_type", type, file);
  return arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM" || arch == "DiffLM" || type == "qwen3" ||
         type == "qwen3_moe";
}

// Qwen3MoeConfig's experts. Layer i is sparse when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step
// == 0; dlm keeps that as moe_layer_pattern (empty when every layer is sparse). router_aux_loss_coef scales
// transformers' aux loss, which is top-k times Megatron's for one MoE layer (docs/moe.md), so dlm's
// Megatron-style coefficient is router_aux_loss_coef * top-k.
void read_moe_fields(const json& j, ModelConfig& c, const std::string& file) {
  read_field(j, "num_local_experts", c.num_experts, file);
  read_field(j, "num_experts", c.num_experts, file);
  if (c.num_experts <= 0) return;
  c.moe_router_topk = detail::require_field<int>(j, "num_experts_per_tok", file);
  c.moe_ffn_hidden_size = detail::require_field<int>(j, "moe_intermediate_size", file);
  c.moe_norm_topk_prob = false;  // Qwen3MoeConfig's default
  read_field(j, "norm_topk_prob", c.moe_norm_topk_prob, file);
  double coef = 0.001;  // Qwen3MoeConfig's default
  read_field(j, "router_aux_loss_coef", coef, file);
  c.moe_aux_loss_coeff = coef * c.moe_router_topk;
  int step = 1;
  read_field(j, "decoder_sparse_step", step, file);
  if (step <= 0) fail_at(file, fmt::format("field 'decoder_sparse_step': {} must be positive", step));
  std::vector<int> dense;
  detail::read_int_list(j, "mlp_only_layers", dense, file);
  if (step == 1 && dense.empty()) return;  // every layer sparse: no pattern
  if (c.num_layers > (1 << 20))
    fail_at(file, fmt::format("field 'num_hidden_layers': {} is too many for a per-layer MoE pattern", c.num_layers));
  std::vector<int> pattern(static_cast<std::size_t>(std::max(c.num_layers, 0)));
  bool all = true;
  for (int i = 0; i < c.num_layers; ++i) {
    pattern[i] = (i + 1) % step == 0 && std::find(dense.begin(), dense.end(), i) == dense.end();
    all = all && pattern[i];
  }
  if (!all) c.moe_layer_pattern = std::move(pattern);
}

void write_moe_fields(const ModelConfig& c, json& j) {
  if (c.moe_router_score_function != MoeScoreFunction::kSoftmax)
    fail("cannot export as Qwen3MoeForCausalLM: its router is softmax, the model's is sigmoid");
  if (c.moe_shared_expert_intermediate_size > 0)
    fail("cannot export as Qwen3MoeForCausalLM: it has no shared expert");
  j.erase("num_local_experts");
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.moe_router_topk;
  j["moe_intermediate_size"] = c.moe_ffn_hidden_size;
  j["norm_topk_prob"] = c.moe_norm_topk_prob;
  j["router_aux_loss_coef"] = c.moe_aux_loss_coeff / c.moe_router_topk;
  j["decoder_sparse_step"] = 1;
  std::vector<int> dense;
  for (int i = 0; i < c.num_layers; ++i)
    if (!c.is_moe_layer(i)) dense.push_back(i);
  j["mlp_only_layers"] = dense;
}

}  // namespace

ModelConfig model_config_from_hf_json(std::string_view text, const std::string& file, int divisible_by) {
  const json j = detail::parse_json(text, file);
  if (!j.is_object()) fail_at(file, "config.json must be a JSON object");
  ModelConfig c;
  c.make_vocab_size_divisible_by = divisible_by;
  if (auto it = j.find("architectures"); it != j.end()) {
    if (!it->is_array() || it->size() != 1 || !(*it)[0].is_string())
      fail_at(file, "field 'architectures': expected a list of one class name");
    c.hf_architecture = (*it)[0].get<std::string>();
  }
  static const std::set<std::string> supported = {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DiffLM"};
  if (!c.hf_architecture.empty() && !supported.count(c.hf_architecture))
    fail_at(file, fmt::format("field 'architectures': '{}' is not supported (LlamaForCausalLM, Qwen3ForCausalLM, "
                              "Qwen3MoeForCausalLM, DiffLM)", c.hf_architecture));
  c.hidden_size = detail::require_field<int>(j, "hidden_size", file);
  c.ffn_hidden_size = detail::require_field<int>(j, "intermediate_size", file);
  c.num_layers = detail::require_field<int>(j, "num_hidden_layers", file);
  c.num_attention_heads = detail::require_field<int>(j, "num_attention_heads", file);
  c.vocab_size = detail::require_field<std::int64_t>(j, "vocab_size", file);
  c.num_query_groups = c.num_attention_heads;
  read_field(j, "num_key_value_heads", c.num_query_groups, file);
  if (c.num_attention_heads > 0) c.kv_channels = c.hidden_size / c.num_attention_heads;
  read_field(j, "head_dim", c.kv_channels, file);
  read_field(j, "max_position_embeddings", c.max_position_embeddings, file);
  read_field(j, "rope_theta", c.rotary_base, file);
  // transformers 5 writes the RoPE settings as rope_parameters {rope_theta, rope_type}.
  if (auto rp = j.find("rope_parameters"); rp != j.end() && rp->is_object()) read_field(*rp, "rope_theta", c.rotary_base, file);
  read_field(j, "rms_norm_eps", c.norm_epsilon, file);
  read_field(j, "initializer_range", c.init_method_std, file);
  read_field(j, "tie_word_embeddings", c.tie_word_embeddings, file);
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    bool b = false;
    if (read_field(j, bias, b, file) && b) fail_at(file, fmt::format("field '{}': true is not supported (dlm's model has no biases)", bias));
  }
  // dlm's MLP is SwiGLU: a config naming another activation would load and compute something else.
  std::string act = "silu";
  if (read_field(j, "hidden_act", act, file) && act != "silu" && act != "swish")
    fail_at(file, fmt::format("field 'hidden_act': '{}' is not supported (dlm's MLP is SwiGLU: silu)", act));
  c.qk_layernorm = has_qk_norm(c.hf_architecture, j, file);
  c.attention_mask = c.hf_architecture == "DiffLM" ? AttentionMask::kBidirectional : AttentionMask::kCausal;
  std::string mask;
  if (read_field(j, "attn_mask_type", mask, file)) {
    if (mask == "bidirectional" || mask == "no_mask") c.attention_mask = AttentionMask::kBidirectional;
    else if (mask == "causal") c.attention_mask = AttentionMask::kCausal;
    else fail_at(file, fmt::format("field 'attn_mask_type': '{}' (expected bidirectional or causal)", mask));
  }
  detail::read_optional(j, "mask_token_id", c.mask_token_id, file);
  read_moe_fields(j, c, file);
  json extra = json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (modeled_fields().count(k)) continue;
    // Special ids are modeled when they are one integer (Llama 3 lists several eos ids: kept as is).
    if ((k == "bos_token_id" || k == "eos_token_id" || k == "pad_token_id") && it->is_number_integer()) continue;
    extra[k] = *it;
  }
  detail::read_optional(j, "bos_token_id", c.bos_token_id, file);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) detail::read_optional(j, "eos_token_id", c.eos_token_id, file);
  detail::read_optional(j, "pad_token_id", c.pad_token_id, file);
  if (!extra.empty()) c.hf_extra_json = extra.dump();
  try {
    c.validate();
  } catch (const Error& e) {
    fail_at(file, e.message());
  }
  return c;
}

bool has_difflm_remote_code(const ModelConfig& c) {
  return c.attention_mask == AttentionMask::kBidirectional && c.num_experts == 0;
}

std::string model_config_to_hf_json(const ModelConfig& c, TensorDType dtype) {
  std::string arch = c.hf_architecture;
  if (arch.empty()) {
    arch = !c.qk_layernorm ? "LlamaForCausalLM"
           : c.num_experts > 0 ? "Qwen3MoeForCausalLM"
           : c.attention_mask == AttentionMask::kBidirectional ? "DiffLM" : "Qwen3ForCausalLM";
  }
  if (arch == "LlamaForCausalLM" && c.qk_layernorm) fail("cannot export as LlamaForCausalLM: the model has q/k norms (use Qwen3ForCausalLM)");
  if (arch != "LlamaForCausalLM" && !c.qk_layernorm) fail(fmt::format("cannot export as {}: the model has no q/k norms", arch));
  if ((arch == "Qwen3MoeForCausalLM") != (c.num_experts > 0))
    fail(fmt::format("cannot export as {}: the model {} experts (Qwen3MoeForCausalLM is the one with experts)", arch,
                     c.num_experts > 0 ? "has" : "has no"));
  json j = c.hf_extra_json.empty() ? json::object() : json::parse(c.hf_extra_json);
  j["architectures"] = {arch};
  if (!j.contains("model_type"))
    j["model_type"] = arch == "LlamaForCausalLM" ? "llama" : arch == "Qwen3MoeForCausalLM" ? "qwen3_moe" : "qwen3";
  if (c.num_experts > 0) write_moe_fields(c, j);
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.ffn_hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_query_groups;
  j["head_dim"] = c.kv_channels;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) j["rope_parameters"]["rope_theta"] = c.rotary_base;
  else j["rope_theta"] = c.rotary_base;
  j["rms_norm_eps"] = c.norm_epsilon;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["initializer_range"] = c.init_method_std;
  j["attention_bias"] = false;
  if (arch == "LlamaForCausalLM") j["mlp_bias"] = false;
  // The import accepted only silu (or none, or null, which transformers reads as the default).
  if (!j.contains("hidden_act") || !j["hidden_act"].is_string()) j["hidden_act"] = "silu";
  const char* dtype_text = dtype == TensorDType::kFloat32 ? "float32" : dtype == TensorDType::kBFloat16 ? "bfloat16" : "float16";
  j["torch_dtype"] = dtype_text;
  if (j.contains("dtype")) j["dtype"] = dtype_text;  // transformers 5's name for it
  if (c.mask_token_id) j["mask_token_id"] = *c.mask_token_id;
  if (arch == "DiffLM" || c.attention_mask != AttentionMask::kCausal)
    j["attn_mask_type"] = c.attention_mask == AttentionMask::kCausal ? "causal" : "bidirectional";
  // A masked-diffusion model names the remote code export_hf_folder writes beside it (MegaDLMs'
  // inference path loads it with trust_remote_code=True); model_type stays, so plain loading gives the
  // causal Qwen3/Llama. Any other auto_map (from an imported folder) names files dlm does not write.
  j.erase("auto_map");
  if (has_difflm_remote_code(c))
    j["auto_map"] = {{"AutoConfig", "configuration_difflm.DiffLMConfig"}, {"AutoModelForCausalLM", "modeling_difflm.DiffLM"}};
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id) j["eos_token_id"] = *c.eos_token_id;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j.dump(2) + "\n";
}

}  // namespace dlm::ckpt
