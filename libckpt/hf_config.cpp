// Hugging Face config.json <-> ModelConfig.
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
      "attention_bias", "mlp_bias"};
  return s;
}

bool has_qk_norm(const std::string& arch, const json& j, const std::string& file) {
  // read_field checks the type: a model_type that is not a string crashed json::value (model_config_fuzz).
  std::string type;
  read_field(j, "model_type", type, file);
  return arch == "Qwen3ForCausalLM" || arch == "DiffLM" || type == "qwen3";
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
  static const std::set<std::string> supported = {"LlamaForCausalLM", "Qwen3ForCausalLM", "DiffLM"};
  if (!c.hf_architecture.empty() && !supported.count(c.hf_architecture))
    fail_at(file, fmt::format("field 'architectures': '{}' is not supported (LlamaForCausalLM, Qwen3ForCausalLM, DiffLM)", c.hf_architecture));
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

std::string model_config_to_hf_json(const ModelConfig& c, TensorDType dtype) {
  std::string arch = c.hf_architecture;
  if (arch.empty()) {
    arch = !c.qk_layernorm ? "LlamaForCausalLM"
           : c.attention_mask == AttentionMask::kBidirectional ? "DiffLM" : "Qwen3ForCausalLM";
  }
  if (arch == "LlamaForCausalLM" && c.qk_layernorm) fail("cannot export as LlamaForCausalLM: the model has q/k norms (use Qwen3ForCausalLM)");
  if (arch != "LlamaForCausalLM" && !c.qk_layernorm) fail(fmt::format("cannot export as {}: the model has no q/k norms", arch));
  json j = c.hf_extra_json.empty() ? json::object() : json::parse(c.hf_extra_json);
  j["architectures"] = {arch};
  if (!j.contains("model_type")) j["model_type"] = arch == "LlamaForCausalLM" ? "llama" : "qwen3";
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
  if (c.attention_mask == AttentionMask::kBidirectional)
    j["auto_map"] = {{"AutoConfig", "configuration_difflm.DiffLMConfig"}, {"AutoModelForCausalLM", "modeling_difflm.DiffLM"}};
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id) j["eos_token_id"] = *c.eos_token_id;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j.dump(2) + "\n";
}

}  // namespace dlm::ckpt
