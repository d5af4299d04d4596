// Hugging Face model folders: config.json <-> ModelConfig, and the tensor-name mapping between HF's
// Llama/Qwen3 layout and dlm's global tensors (model_config.h).
//
//   HF (per layer N, prefix model.layers.N.)        dlm global tensor
//   input_layernorm.weight                          self_attention.linear_qkv.layer_norm_weight
//   self_attn.{q,k,v}_proj.weight                   self_attention.linear_qkv.weight, rows per KV group g:
//                                                     [q heads g*H/G .. (g+1)*H/G - 1 | k head g | v head g]
//   self_attn.{q,k}_norm.weight                     self_attention.{q,k}_layernorm.weight (Qwen3, DiffLM)
//   self_attn.o_proj.weight                         self_attention.linear_proj.weight
//   post_attention_layernorm.weight                 mlp.linear_fc1.layer_norm_weight
//   mlp.{gate,up}_proj.weight                       mlp.linear_fc1.weight = [gate ; up]
//   mlp.down_proj.weight                            mlp.linear_fc2.weight
//   model.embed_tokens.weight / lm_head.weight      embedding.word_embeddings.weight / output_layer.weight
//   model.norm.weight                               decoder.final_layernorm.weight
// An MoE layer of Qwen3MoeForCausalLM (saved by transformers 5 one tensor per expert, though its modules hold
// them fused; docs/moe.md):
//   post_attention_layernorm.weight                 pre_mlp_layernorm.weight
//   mlp.gate.weight                                 mlp.router.weight [experts, hidden]
//   mlp.experts.E.{gate,up}_proj.weight             mlp.experts.linear_fc1.weight[E] = [gate ; up]
//   mlp.experts.E.down_proj.weight                  mlp.experts.linear_fc2.weight[E]
// HF's vocabulary is config.vocab_size rows; dlm's is padded_vocab_size() rows, the padding rows zero on
// import and dropped on export. Tied embeddings have no lm_head / output_layer (an lm_head present in a
// tied HF folder is ignored). rotary_emb.inv_freq buffers are ignored; any other unknown HF tensor, or a
// missing one, is an error naming it.
#pragma once

#include <cstdint>
#include <string>

#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/safetensors.h"
#include "dlm/ckpt/tensor.h"

namespace dlm::ckpt {

// config.json -> ModelConfig. Reads LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM and DiffLM (MegaDLMs' export:
// Qwen3 fields plus mask_token_id and attn_mask_type); fields dlm does not model are kept in
// hf_extra_json. Biases (attention_bias / mlp_bias true) are rejected: dlm's model has none.
ModelConfig model_config_from_hf_json(std::string_view text, const std::string& file, int make_vocab_size_divisible_by = 128);
// ModelConfig -> config.json text. The architecture is config.hf_architecture, else DiffLM for a
// bidirectional model with q/k norms, Qwen3ForCausalLM with q/k norms, LlamaForCausalLM without.
// torch_dtype is set to `dtype`. A bidirectional model gets auto_map (AutoConfig, AutoModelForCausalLM)
// naming dlm's remote code; any other auto_map is dropped.
std::string model_config_to_hf_json(const ModelConfig& config, TensorDType dtype);
// Whether an export carries DiffLM's remote code (auto_map): a bidirectional model without experts (the
// remote code has no MoE layer).
bool has_difflm_remote_code(const ModelConfig& config);

// The HF tensors (any dtype) -> dlm's global fp32 tensors.
TensorSet hf_to_native(const ModelConfig& config, const SafetensorsFolder& hf);
// dlm's global fp32 tensors -> HF names, in `dtype`; every tensor of model_tensors(config) must be there
// with its global shape.
TensorSet native_to_hf(const ModelConfig& config, const TensorSet& native, TensorDType dtype);

struct HfModel {
  ModelConfig config;
  TensorSet tensors;  // dlm's global tensors, fp32
};
HfModel load_hf_folder(const std::string& dir, int make_vocab_size_divisible_by = 128);

struct HfExportOptions {
  TensorDType dtype = TensorDType::kFloat32;
  std::string tokenizer_dir{};  // its tokenizer files (tokenizer.json, tokenizer_config.json...) are copied
  std::uint64_t max_shard_bytes = 5ull << 30;
  // > 0: at most this many shards, as even as tensor boundaries allow (the smallest shard-size cap
  // that packs into that many); replaces max_shard_bytes.
  int num_shards = 0;
};
// Writes config.json, the safetensors (one file, or shards with model.safetensors.index.json) and the
// tokenizer files. A bidirectional (masked-diffusion) model also gets configuration_difflm.py and
// modeling_difflm.py, named by config.json's auto_map: transformers with trust_remote_code=True loads
// it as a bidirectional DiffLM whose generate() is dlm-generate's sampler (docs/checkpoints.md).
void export_hf_folder(const std::string& dir, const ModelConfig& config, const TensorSet& native, const HfExportOptions& options = {});

// Copies the tokenizer files of `from` (those that exist) into `to`; returns how many.
int copy_tokenizer_files(const std::string& from, const std::string& to);

}  // namespace dlm::ckpt
