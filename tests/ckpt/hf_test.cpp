#include "dlm/ckpt/hf.h"

#include <cstring>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "dlm/ckpt/tools.h"
#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace dlm::ckpt;
using nlohmann::json;

namespace {

bool same_bytes(const TensorSet& a, const TensorSet& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.shape != t.shape || it->second.bytes != t.bytes) return false;
  }
  return true;
}

TEST(HfConfig, Qwen3DiffLmFieldsSurviveARoundTrip) {
  const std::string text = R"({"architectures": ["DiffLM"], "model_type": "qwen3", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 4096, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": false, "attention_bias": false, "mask_token_id": 999,
    "attn_mask_type": "bidirectional", "eos_token_id": 7, "sliding_window": null, "use_cache": true,
    "rope_scaling": null, "hidden_act": "silu", "torch_dtype": "bfloat16"})";
  const ModelConfig c = model_config_from_hf_json(text, "config.json");
  EXPECT_EQ(c.hf_architecture, "DiffLM");
  EXPECT_TRUE(c.qk_layernorm);
  EXPECT_EQ(c.kv_channels, 32);  // head_dim, not hidden / heads
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.padded_vocab_size(), 1024);
  EXPECT_EQ(c.mask_token_id, 999);
  EXPECT_EQ(c.eos_token_id, 7);
  EXPECT_EQ(c.attention_mask, AttentionMask::kBidirectional);
  EXPECT_DOUBLE_EQ(c.rotary_base, 1e6);
  // Through dlm's own JSON (a checkpoint's metadata) and back to config.json.
  const ModelConfig back = model_config_from_json(model_config_to_json(c), "metadata.json");
  json in = json::parse(text), out = json::parse(model_config_to_hf_json(back, TensorDType::kBFloat16));
  for (auto& [k, v] : in.items()) EXPECT_EQ(out[k], v) << k;
  EXPECT_EQ(out["head_dim"], 32);
}

TEST(HfConfig, Transformers5RopeParametersAndDtype) {
  const std::string text = R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "vocab_size": 1000, "dtype": "float32", "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}})";
  ModelConfig c = model_config_from_hf_json(text, "config.json");
  EXPECT_DOUBLE_EQ(c.rotary_base, 1e6);
  c.rotary_base = 5e5;
  const json out = json::parse(model_config_to_hf_json(c, TensorDType::kBFloat16));
  EXPECT_EQ(out["rope_parameters"]["rope_theta"], 5e5);
  EXPECT_FALSE(out.contains("rope_theta"));
  EXPECT_EQ(out["dtype"], "bfloat16");
}

// Qwen3MoeConfig's experts: decoder_sparse_step and mlp_only_layers become dlm's per-layer pattern,
// router_aux_loss_coef * top-k dlm's Megatron-style coefficient; both ways, and through dlm's metadata JSON.
TEST(HfConfig, Qwen3MoeExpertsAndSparseLayers) {
  const std::string text = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "vocab_size": 1000, "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "norm_topk_prob": true, "router_aux_loss_coef": 0.001, "decoder_sparse_step": 2, "mlp_only_layers": [3],
    "output_router_logits": false})";
  const ModelConfig c = model_config_from_hf_json(text, "config.json");
  EXPECT_TRUE(c.qk_layernorm);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.moe_router_topk, 2);
  EXPECT_EQ(c.moe_ffn_hidden_size, 32);
  EXPECT_TRUE(c.moe_norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.moe_aux_loss_coeff, 0.002);
  EXPECT_EQ(c.moe_layer_pattern, (std::vector<int>{0, 1, 0, 0, 0, 1}));  // (i + 1) % 2 == 0, not layer 3
  int tensors = 0;
  for (const auto& spec : model_tensors(c)) tensors += spec.name.find("mlp.experts.linear_fc1") != std::string::npos;
  EXPECT_EQ(tensors, 2);
  const ModelConfig back = model_config_from_json(model_config_to_json(c), "metadata.json");
  EXPECT_EQ(back.moe_layer_pattern, c.moe_layer_pattern);
  EXPECT_DOUBLE_EQ(back.moe_aux_loss_coeff, c.moe_aux_loss_coeff);
  const json out = json::parse(model_config_to_hf_json(back, TensorDType::kFloat32));
  EXPECT_EQ(out["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(out["model_type"], "qwen3_moe");
  EXPECT_EQ(out["num_experts"], 8);
  EXPECT_FALSE(out.contains("num_local_experts"));
  EXPECT_EQ(out["decoder_sparse_step"], 1);
  EXPECT_EQ(out["mlp_only_layers"], json({0, 2, 3, 4}));
  EXPECT_DOUBLE_EQ(out["router_aux_loss_coef"].get<double>(), 0.001);
  EXPECT_EQ(out["output_router_logits"], false);  // kept as it came
  EXPECT_FALSE(out.contains("auto_map"));
  ModelConfig sigmoid = c;
  sigmoid.moe_router_score_function = MoeScoreFunction::kSigmoid;
  EXPECT_THROW(model_config_to_hf_json(sigmoid, TensorDType::kFloat32), dlm::Error);
}

TEST(HfConfig, LlamaDefaultsAndErrors) {
  const ModelConfig c = model_config_from_hf_json(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
    "eos_token_id": [1, 2]})", "c.json");
  EXPECT_FALSE(c.qk_layernorm);
  EXPECT_EQ(c.num_query_groups, 4);
  EXPECT_EQ(c.kv_channels, 16);
  EXPECT_EQ(c.attention_mask, AttentionMask::kCausal);
  EXPECT_FALSE(c.eos_token_id.has_value());
  EXPECT_EQ(json::parse(model_config_to_hf_json(c, TensorDType::kFloat32))["eos_token_id"], json({1, 2}));
  auto err = [](const std::string& t) {
    try {
      model_config_from_hf_json(t, "c.json");
    } catch (const dlm::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err(R"({"hidden_size": 64})").find("c.json: missing field 'intermediate_size'"), std::string::npos);
  EXPECT_NE(err(R"({"architectures": ["GPT2LMHeadModel"]})").find("not supported"), std::string::npos);
  EXPECT_NE(err(R"({"hidden_size": "64"})").find("field 'hidden_size': wrong type"), std::string::npos);
  EXPECT_NE(err(R"({"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "vocab_size": 256, "attention_bias": true})").find("attention_bias"), std::string::npos);
  // model_config_fuzz found "hidden_act": 0 crashing the export (nlohmann type_error); another activation
  // would have been computed as SwiGLU: both refused on import.
  const std::string shape = R"("hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256)";
  EXPECT_NE(err("{" + shape + R"(, "hidden_act": 0})").find("field 'hidden_act': wrong type"), std::string::npos);
  EXPECT_NE(err("{" + shape + R"(, "hidden_act": "gelu"})").find("'gelu' is not supported"), std::string::npos);
  EXPECT_EQ(err("{" + shape + R"(, "hidden_act": "silu"})"), "");
  // ...and "hidden_act": null (transformers' default) crashed the export the same way.
  const ModelConfig null_act = model_config_from_hf_json("{" + shape + R"(, "hidden_act": null})", "c.json");
  EXPECT_EQ(json::parse(model_config_to_hf_json(null_act, TensorDType::kFloat32))["hidden_act"], "silu");
  // model_config_fuzz: "model_type" of the wrong type crashed the qk-norm check.
  EXPECT_NE(err("{" + shape + R"(, "model_type": 3})").find("field 'model_type': wrong type"), std::string::npos);
  EXPECT_THROW(model_config_from_json(R"({"num_layers": 2, "bogus": 1})", "m.json"), dlm::Error);
}

TEST(HfMapping, QkvGroupedPerKvHeadAndFc1GateUp) {
  ModelConfig c = test::small_config();
  c.num_layers = 1;
  const TensorSet native = test::random_model(c, 1);
  const TensorSet hf = native_to_hf(c, native, TensorDType::kFloat32);
  const std::int64_t d = 8, h = 32;
  const auto& qkv = native.at("decoder.layers.0.self_attention.linear_qkv.weight").f32();
  const auto& k = hf.at("model.layers.0.self_attn.k_proj.weight").f32();
  const auto& q = hf.at("model.layers.0.self_attn.q_proj.weight").f32();
  // Group 1 of 2 (heads 2, 3): rows [4d, 6d) are q heads 2-3, [6d, 7d) k head 1, [7d, 8d) v head 1.
  EXPECT_EQ(qkv[(4 * d) * h + 5], q[(2 * d) * h + 5]);
  EXPECT_EQ(qkv[(6 * d + 3) * h + 7], k[(d + 3) * h + 7]);
  const auto& fc1 = native.at("decoder.layers.0.mlp.linear_fc1.weight").f32();
  EXPECT_EQ(fc1[48 * h], hf.at("model.layers.0.mlp.up_proj.weight").f32()[0]);
  EXPECT_EQ(hf.at("model.embed_tokens.weight").shape[0], 300);  // padding removed
  EXPECT_FALSE(hf.count("model.layers.1.self_attn.q_proj.weight"));
}

TEST(HfMapping, FolderRoundTripIsBitExactAndCopiesTokenizer) {
  for (bool tied : {false, true}) {
    const auto dir = test::fresh_dir(tied ? "hf_tied" : "hf");
    const ModelConfig c = test::small_config(true, tied);
    const TensorSet native = test::random_model(c, 7);
    dlm::write_file_atomically((dir / "tokenizer.json").string(), "{\"version\": \"1.0\"}");
    export_hf_folder((dir / "out").string(), c, native, {.tokenizer_dir = dir.string(), .max_shard_bytes = 20000});
    EXPECT_TRUE(fs::exists(dir / "out" / "model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(dir / "out" / "tokenizer.json"));
    const HfModel back = load_hf_folder((dir / "out").string());
    EXPECT_TRUE(same_bytes(back.tensors, native));
    EXPECT_EQ(back.config.tie_word_embeddings, tied);
    EXPECT_EQ(back.config.padded_vocab_size(), 384);
  }
}

// A masked-diffusion export names dlm's remote code in auto_map and writes it; a causal export over the
// same folder drops both (and an imported auto_map, which names files dlm does not write).
TEST(HfMapping, BidirectionalExportWritesRemoteCodeAndAutoMap) {
  const auto dir = test::fresh_dir("hf_remote");
  ModelConfig c = test::small_config();
  c.attention_mask = AttentionMask::kBidirectional;
  c.mask_token_id = 299;
  c.hf_extra_json = R"({"auto_map": {"AutoModelForCausalLM": "modeling_dlm.DiffLM"}})";
  const TensorSet native = test::random_model(c, 5);
  export_hf_folder(dir.string(), c, native);
  const json cfg = json::parse(dlm::read_text_file((dir / "config.json").string()));
  EXPECT_EQ(cfg["auto_map"]["AutoConfig"], "configuration_difflm.DiffLMConfig");
  EXPECT_EQ(cfg["auto_map"]["AutoModelForCausalLM"], "modeling_difflm.DiffLM");
  EXPECT_EQ(cfg["model_type"], "qwen3");
  const std::string modeling = dlm::read_text_file((dir / "modeling_difflm.py").string());
  EXPECT_NE(modeling.find("class DiffLM(DiffLMPreTrainedModel)"), std::string::npos);
  EXPECT_NE(dlm::read_text_file((dir / "configuration_difflm.py").string()).find("class DiffLMConfig"), std::string::npos);
  EXPECT_EQ(load_hf_folder(dir.string()).config.attention_mask, AttentionMask::kBidirectional);

  c.attention_mask = AttentionMask::kCausal;
  export_hf_folder(dir.string(), c, native);
  EXPECT_FALSE(json::parse(dlm::read_text_file((dir / "config.json").string())).contains("auto_map"));
  EXPECT_FALSE(fs::exists(dir / "modeling_difflm.py"));
  EXPECT_FALSE(fs::exists(dir / "configuration_difflm.py"));
}

TEST(HfMapping, NumShardsWritesThatManyEvenShards) {
  const auto dir = test::fresh_dir("hf_shards");
  const ModelConfig c = test::small_config();
  const TensorSet native = test::random_model(c, 6);
  for (int n : {1, 2, 3, 5}) {
    fs::remove_all(dir);
    export_hf_folder(dir.string(), c, native, {.num_shards = n});
    int files = 0;
    std::uintmax_t largest = 0, total = 0;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") ++files, largest = std::max(largest, e.file_size()), total += e.file_size();
    EXPECT_EQ(files, n);
    EXPECT_EQ(fs::exists(dir / "model.safetensors.index.json"), n > 1);
    EXPECT_LT(largest, total / n * 3 / 2) << n;  // even: no shard far above its share
    EXPECT_TRUE(same_bytes(load_hf_folder(dir.string()).tensors, native));
  }
}

TEST(HfExport, ShardSizesReadAsTransformersWritesThem) {
  std::uint64_t b = 0;
  EXPECT_TRUE(parse_byte_size("5GB", b));
  EXPECT_EQ(b, 5000000000ull);
  EXPECT_TRUE(parse_byte_size("500MiB", b));
  EXPECT_EQ(b, 500ull << 20);
  EXPECT_TRUE(parse_byte_size("123", b));
  EXPECT_EQ(b, 123u);
  EXPECT_TRUE(parse_byte_size("2kb", b));
  EXPECT_EQ(b, 2000u);
  for (const char* bad : {"", "GB", "5XB", "5 GB", "0", "-1MB", "5GBB"}) EXPECT_FALSE(parse_byte_size(bad, b)) << bad;
}

TEST(HfMapping, MissingAndUnexpectedTensorsAreNamed) {
  const auto dir = test::fresh_dir("hf");
  const ModelConfig c = test::small_config();
  TensorSet hf = native_to_hf(c, test::random_model(c, 3), TensorDType::kBFloat16);
  hf["model.layers.0.self_attn.q_proj.bias"] = Tensor::zeros("model.layers.0.self_attn.q_proj.bias", {32});
  std::vector<TensorView> views;
  for (auto& [n, t] : hf) views.push_back(t.view());
  write_safetensors_folder(dir.string(), views);
  try {
    hf_to_native(c, SafetensorsFolder(dir.string()));
    FAIL();
  } catch (const dlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"), std::string::npos) << e.what();
  }
  views.clear();
  hf.erase("model.layers.0.self_attn.q_proj.bias");
  hf.erase("model.layers.2.mlp.up_proj.weight");
  for (auto& [n, t] : hf) views.push_back(t.view());
  write_safetensors_folder(dir.string(), views);
  try {
    hf_to_native(c, SafetensorsFolder(dir.string()));
    FAIL();
  } catch (const dlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.layers.2.mlp.up_proj.weight' is missing"), std::string::npos) << e.what();
  }
}

}  // namespace
