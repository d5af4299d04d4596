// ModelConfig: the shape of a Llama/Qwen3-style transformer, and the global tensors it has.
//
// One definition shared by the trainer (libtrain), the checkpoint store and the Hugging Face mapping
// (libckpt). Tensor names and layouts are megatron-core's (see docs/sharding.md):
//   embedding.word_embeddings.weight                          [padded_vocab, hidden]
//   decoder.layers.N.self_attention.linear_qkv.layer_norm_weight [hidden]    (input RMSNorm)
//   decoder.layers.N.self_attention.linear_qkv.weight          [(heads + 2*groups) * head_dim, hidden]
//       rows grouped per KV group g: [q of the heads/groups heads of g | k of g | v of g]
//   decoder.layers.N.self_attention.q_layernorm.weight         [head_dim]   (only with qk_layernorm)
//   decoder.layers.N.self_attention.k_layernorm.weight         [head_dim]   (only with qk_layernorm)
//   decoder.layers.N.self_attention.linear_proj.weight         [hidden, heads * head_dim]
//   decoder.layers.N.mlp.linear_fc1.layer_norm_weight          [hidden]     (post-attention RMSNorm)
//   decoder.layers.N.mlp.linear_fc1.weight                     [2 * ffn, hidden]  rows [gate | up]
//   decoder.layers.N.mlp.linear_fc2.weight                     [hidden, ffn]
//   decoder.final_layernorm.weight                             [hidden]
//   output_layer.weight                                        [padded_vocab, hidden] (absent when tied)
// A mixture-of-experts layer (num_experts > 0 and is_moe_layer(N); docs/moe.md) replaces the two mlp.linear_fc*
// tensors and their norm with:
//   decoder.layers.N.pre_mlp_layernorm.weight                  [hidden]     (post-attention RMSNorm)
//   decoder.layers.N.mlp.router.weight                         [experts, hidden]
//   decoder.layers.N.mlp.experts.linear_fc1.weight             [experts, 2 * moe_ffn, hidden]  rows [gate | up]
//   decoder.layers.N.mlp.experts.linear_fc2.weight             [experts, hidden, moe_ffn]
// and, with a shared expert (moe_shared_expert_intermediate_size S > 0; Megatron's), a SwiGLU every token runs
// beside the routed experts, its output added to theirs:
//   decoder.layers.N.mlp.shared_experts.linear_fc1.weight      [2 * S, hidden]  rows [gate | up]
//   decoder.layers.N.mlp.shared_experts.linear_fc2.weight      [hidden, S]
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlm::ckpt {

enum class AttentionMask { kBidirectional, kCausal };
// The router's scores (Megatron's --moe-router-score-function): softmax over the experts, or a sigmoid each.
enum class MoeScoreFunction { kSoftmax, kSigmoid };
// Which routed tokens an expert over its capacity keeps (Megatron's --moe-token-drop-policy): the highest combine
// weights, or the earliest tokens.
enum class MoeDropPolicy { kProbs, kPosition };

struct ModelConfig {
  int num_layers = 2;
  int hidden_size = 64;
  int ffn_hidden_size = 172;
  int num_attention_heads = 4;
  int num_query_groups = 2;           // KV heads (GQA); == heads for MHA
  int kv_channels = 16;               // head dim; hidden / heads unless set
  std::int64_t vocab_size = 256;      // the tokenizer's ids
  int make_vocab_size_divisible_by = 128;
  int max_position_embeddings = 2048;
  double rotary_base = 10000.0;       // RoPE theta
  double norm_epsilon = 1e-6;
  bool qk_layernorm = false;
  bool tie_word_embeddings = false;
  AttentionMask attention_mask = AttentionMask::kBidirectional;
  double init_method_std = 0.02;
  std::optional<std::int32_t> mask_token_id;  // diffusion models
  std::optional<std::int32_t> bos_token_id, eos_token_id, pad_token_id;
  // Mixture of experts (Megatron's --num-experts ...; 0 experts: every layer dense). Layer i is an MoE layer
  // when moe_layer_pattern[i] != 0, or, with the pattern empty, when i % moe_layer_freq == 0 (Megatron's
  // --moe-layer-freq N; HF's decoder_sparse_step / mlp_only_layers become a pattern).
  int num_experts = 0;
  int moe_router_topk = 2;
  int moe_ffn_hidden_size = 0;                   // each expert's SwiGLU width (HF moe_intermediate_size)
  int moe_shared_expert_intermediate_size = 0;   // the shared expert's SwiGLU width (0: none)
  int moe_layer_freq = 1;
  std::vector<int> moe_layer_pattern;            // empty, or num_layers entries of 0 (dense) / 1 (MoE)
  MoeScoreFunction moe_router_score_function = MoeScoreFunction::kSoftmax;
  // The top-k weights divided by their sum (HF norm_topk_prob; Megatron's softmax router without
  // --moe-router-pre-softmax, and its sigmoid router, always do).
  bool moe_norm_topk_prob = true;
  double moe_aux_loss_coeff = 0.0;  // Megatron's switch load-balancing loss, per MoE layer
  double moe_z_loss_coeff = 0.0;    // ST-MoE's router z-loss, per MoE layer
  // Token dropping (docs/moe.md): each expert keeps at most ceil(N k / E * factor) of a micro-batch's N tokens; 0 is
  // dropless (Megatron's --moe-expert-capacity-factor unset).
  double moe_expert_capacity_factor = 0.0;
  MoeDropPolicy moe_token_drop_policy = MoeDropPolicy::kProbs;
  // Hugging Face provenance, kept so that HF -> dlm -> HF gives back the same config.json:
  std::string hf_architecture;  // "LlamaForCausalLM", "Qwen3ForCausalLM", "DiffLM"; "" = chosen on export
  std::string hf_extra_json;    // JSON object of config.json fields dlm does not model ("" = none)

  // vocab_size rounded up to a multiple of make_vocab_size_divisible_by (Megatron's padding).
  std::int64_t padded_vocab_size() const;
  std::int64_t q_size() const { return std::int64_t{num_attention_heads} * kv_channels; }
  std::int64_t kv_size() const { return std::int64_t{num_query_groups} * kv_channels; }
  bool is_moe_layer(int layer) const;
  // Throws dlm::Error with a one-line reason when the shape is impossible (heads not dividing hidden
  // when kv_channels is derived, groups not dividing heads, non-positive sizes...).
  void validate() const;
};

enum class TensorDType { kFloat32, kBFloat16, kFloat16 };

struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  bool is_norm = false;  // RMSNorm weights: no weight decay, initialised to 1
};

// dlm's own JSON form (the "model" object of a checkpoint's metadata.json): the fields above by name,
// attention_mask "bidirectional" | "causal", absent ids omitted. Parsing rejects unknown fields and wrong
// types with a dlm::Error naming `file` and the field, then validate()s.
std::string model_config_to_json(const ModelConfig& config);
ModelConfig model_config_from_json(std::string_view text, const std::string& file);

// Every global tensor of the model, in a fixed order (embedding, layers in order, final norm, output).
std::vector<TensorSpec> model_tensors(const ModelConfig& config);

}  // namespace dlm::ckpt
