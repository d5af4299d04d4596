// The tensor-name mapping between Hugging Face's Llama/Qwen3 layout and dlm's global tensors (hf.h).
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "dlm/ckpt/hf.h"
#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "hf_remote_code.h"

namespace dlm::ckpt {
namespace {

namespace fs = std::filesystem;

// Copies `rows` rows of `src` starting at src_row into `dst` at dst_row (same row width, same dtype).
void copy_rows(Tensor& dst, std::int64_t dst_row, const Tensor& src, std::int64_t src_row, std::int64_t rows) {
  const std::size_t width = dst.bytes.size() / static_cast<std::size_t>(dst.shape[0]);
  std::memcpy(dst.bytes.data() + dst_row * width, src.bytes.data() + src_row * width, rows * width);
}

class HfReader {
 public:
  HfReader(const SafetensorsFolder& hf) : hf_(hf) {}
  // The HF tensor as fp32, checked against its expected shape.
  Tensor get(const std::string& name, std::vector<std::int64_t> shape) {
    const TensorView* v = hf_.find(name);
    if (!v) fail(fmt::format("Hugging Face checkpoint: tensor '{}' is missing", name));
    if (v->shape != shape)
      fail(fmt::format("Hugging Face checkpoint: tensor '{}' has shape [{}], the config needs [{}]", name,
                       fmt::join(v->shape, ", "), fmt::join(shape, ", ")));
    used_.insert(name);
    return convert(*v, TensorDType::kFloat32);
  }
  bool has(const std::string& name) const { return hf_.find(name) != nullptr; }
  void ignore(const std::string& name) { used_.insert(name); }
  void check_all_used() const {
    for (const TensorView* v : hf_.tensors()) {
      if (used_.count(v->name) || v->name.ends_with("rotary_emb.inv_freq")) continue;
      fail(fmt::format("Hugging Face checkpoint: unexpected tensor '{}' (not part of this config's model)", v->name));
    }
  }

 private:
  const SafetensorsFolder& hf_;
  std::set<std::string> used_;
};

// The vocabulary rows: HF has vocab_size, dlm padded_vocab_size (zero rows appended).
Tensor pad_vocab(Tensor t, std::string name, std::int64_t padded) {
  Tensor out = Tensor::zeros(std::move(name), {padded, t.shape[1]});
  copy_rows(out, 0, t, 0, t.shape[0]);
  return out;
}

const Tensor& need(const TensorSet& s, const std::string& name, const std::vector<std::int64_t>& shape) {
  auto it = s.find(name);
  if (it == s.end()) fail(fmt::format("checkpoint: global tensor '{}' is missing", name));
  if (it->second.shape != shape || it->second.dtype != TensorDType::kFloat32)
    fail(fmt::format("checkpoint: tensor '{}' is {} [{}], expected F32 [{}]", name, dtype_name(it->second.dtype),
                     fmt::join(it->second.shape, ", "), fmt::join(shape, ", ")));
  return it->second;
}

// The smallest cap for which write_safetensors_folder's greedy packing (a new shard when the next tensor
// would pass the cap) makes at most `shards` files.
std::uint64_t shard_cap_for(const std::vector<TensorView>& views, int shards) {
  auto count = [&](std::uint64_t cap) {
    int n = 1;
    std::uint64_t in = 0;
    for (const TensorView& v : views) {
      if (in > 0 && in + v.bytes.size() > cap) ++n, in = 0;
      in += v.bytes.size();
    }
    return n;
  };
  std::uint64_t lo = 1, hi = 1;
  for (const TensorView& v : views) hi += v.bytes.size();
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (count(mid) <= shards) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

}  // namespace

TensorSet hf_to_native(const ModelConfig& c, const SafetensorsFolder& hf) {
  c.validate();
  HfReader r(hf);
  const std::int64_t h = c.hidden_size, d = c.kv_channels, f = c.ffn_hidden_size, v = c.vocab_size;
  const std::int64_t heads = c.num_attention_heads, groups = c.num_query_groups, per_group = heads / groups;
  TensorSet out;
  auto put = [&](Tensor t, const std::string& name) {
    t.name = name;
    out[name] = std::move(t);
  };
  put(pad_vocab(r.get("model.embed_tokens.weight", {v, h}), "", c.padded_vocab_size()), "embedding.word_embeddings.weight");
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string hp = fmt::format("model.layers.{}.", i), p = fmt::format("decoder.layers.{}.", i);
    put(r.get(hp + "input_layernorm.weight", {h}), p + "self_attention.linear_qkv.layer_norm_weight");
    const Tensor q = r.get(hp + "self_attn.q_proj.weight", {heads * d, h});
    const Tensor k = r.get(hp + "self_attn.k_proj.weight", {groups * d, h});
    const Tensor vv = r.get(hp + "self_attn.v_proj.weight", {groups * d, h});
    Tensor qkv = Tensor::zeros("", {(heads + 2 * groups) * d, h});
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t base = g * (per_group + 2) * d;
      copy_rows(qkv, base, q, g * per_group * d, per_group * d);
      copy_rows(qkv, base + per_group * d, k, g * d, d);
      copy_rows(qkv, base + (per_group + 1) * d, vv, g * d, d);
    }
    put(std::move(qkv), p + "self_attention.linear_qkv.weight");
    if (c.qk_layernorm) {
      put(r.get(hp + "self_attn.q_norm.weight", {d}), p + "self_attention.q_layernorm.weight");
      put(r.get(hp + "self_attn.k_norm.weight", {d}), p + "self_attention.k_layernorm.weight");
    }
    put(r.get(hp + "self_attn.o_proj.weight", {h, heads * d}), p + "self_attention.linear_proj.weight");
    if (c.is_moe_layer(i)) {
      const std::int64_t e = c.num_experts, mf = c.moe_ffn_hidden_size;
      put(r.get(hp + "post_attention_layernorm.weight", {h}), p + "pre_mlp_layernorm.weight");
      put(r.get(hp + "mlp.gate.weight", {e, h}), p + "mlp.router.weight");
      Tensor fc1 = Tensor::zeros("", {e * 2 * mf, h}), fc2 = Tensor::zeros("", {e * h, mf});
      for (std::int64_t x = 0; x < e; ++x) {
        const std::string ep = fmt::format("{}mlp.experts.{}.", hp, x);
        copy_rows(fc1, x * 2 * mf, r.get(ep + "gate_proj.weight", {mf, h}), 0, mf);
        copy_rows(fc1, x * 2 * mf + mf, r.get(ep + "up_proj.weight", {mf, h}), 0, mf);
        copy_rows(fc2, x * h, r.get(ep + "down_proj.weight", {h, mf}), 0, h);
      }
      fc1.shape = {e, 2 * mf, h};
      fc2.shape = {e, h, mf};
      put(std::move(fc1), p + "mlp.experts.linear_fc1.weight");
      put(std::move(fc2), p + "mlp.experts.linear_fc2.weight");
      continue;
    }
    put(r.get(hp + "post_attention_layernorm.weight", {h}), p + "mlp.linear_fc1.layer_norm_weight");
    Tensor fc1 = Tensor::zeros("", {2 * f, h});
    copy_rows(fc1, 0, r.get(hp + "mlp.gate_proj.weight", {f, h}), 0, f);
    copy_rows(fc1, f, r.get(hp + "mlp.up_proj.weight", {f, h}), 0, f);
    put(std::move(fc1), p + "mlp.linear_fc1.weight");
    put(r.get(hp + "mlp.down_proj.weight", {h, f}), p + "mlp.linear_fc2.weight");
  }
  put(r.get("model.norm.weight", {h}), "decoder.final_layernorm.weight");
  if (!c.tie_word_embeddings) put(pad_vocab(r.get("lm_head.weight", {v, h}), "", c.padded_vocab_size()), "output_layer.weight");
  else r.ignore("lm_head.weight");
  r.check_all_used();
  return out;
}

TensorSet native_to_hf(const ModelConfig& c, const TensorSet& native, TensorDType dtype) {
  c.validate();
  const std::int64_t h = c.hidden_size, d = c.kv_channels, f = c.ffn_hidden_size, v = c.vocab_size, pv = c.padded_vocab_size();
  const std::int64_t heads = c.num_attention_heads, groups = c.num_query_groups, per_group = heads / groups;
  TensorSet out;
  auto put = [&](const Tensor& t, const std::string& name) {
    Tensor o = convert(t.view(), dtype);
    o.name = name;
    out[name] = std::move(o);
  };
  auto rows = [&](const Tensor& src, std::int64_t first, std::int64_t n) {
    Tensor t = Tensor::zeros("", {n, src.shape[1]});
    copy_rows(t, 0, src, first, n);
    return t;
  };
  put(rows(need(native, "embedding.word_embeddings.weight", {pv, h}), 0, v), "model.embed_tokens.weight");
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string hp = fmt::format("model.layers.{}.", i), p = fmt::format("decoder.layers.{}.", i);
    put(need(native, p + "self_attention.linear_qkv.layer_norm_weight", {h}), hp + "input_layernorm.weight");
    const Tensor& qkv = need(native, p + "self_attention.linear_qkv.weight", {(heads + 2 * groups) * d, h});
    Tensor q = Tensor::zeros("", {heads * d, h}), k = Tensor::zeros("", {groups * d, h}), vv = Tensor::zeros("", {groups * d, h});
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t base = g * (per_group + 2) * d;
      copy_rows(q, g * per_group * d, qkv, base, per_group * d);
      copy_rows(k, g * d, qkv, base + per_group * d, d);
      copy_rows(vv, g * d, qkv, base + (per_group + 1) * d, d);
    }
    put(q, hp + "self_attn.q_proj.weight");
    put(k, hp + "self_attn.k_proj.weight");
    put(vv, hp + "self_attn.v_proj.weight");
    if (c.qk_layernorm) {
      put(need(native, p + "self_attention.q_layernorm.weight", {d}), hp + "self_attn.q_norm.weight");
      put(need(native, p + "self_attention.k_layernorm.weight", {d}), hp + "self_attn.k_norm.weight");
    }
    put(need(native, p + "self_attention.linear_proj.weight", {h, heads * d}), hp + "self_attn.o_proj.weight");
    if (c.is_moe_layer(i)) {
      const std::int64_t e = c.num_experts, mf = c.moe_ffn_hidden_size;
      put(need(native, p + "pre_mlp_layernorm.weight", {h}), hp + "post_attention_layernorm.weight");
      put(need(native, p + "mlp.router.weight", {e, h}), hp + "mlp.gate.weight");
      Tensor fc1 = need(native, p + "mlp.experts.linear_fc1.weight", {e, 2 * mf, h});
      Tensor fc2 = need(native, p + "mlp.experts.linear_fc2.weight", {e, h, mf});
      fc1.shape = {e * 2 * mf, h};  // the experts' matrices stacked along the rows
      fc2.shape = {e * h, mf};
      for (std::int64_t x = 0; x < e; ++x) {
        const std::string ep = fmt::format("{}mlp.experts.{}.", hp, x);
        put(rows(fc1, x * 2 * mf, mf), ep + "gate_proj.weight");
        put(rows(fc1, x * 2 * mf + mf, mf), ep + "up_proj.weight");
        put(rows(fc2, x * h, h), ep + "down_proj.weight");
      }
      continue;
    }
    put(need(native, p + "mlp.linear_fc1.layer_norm_weight", {h}), hp + "post_attention_layernorm.weight");
    const Tensor& fc1 = need(native, p + "mlp.linear_fc1.weight", {2 * f, h});
    put(rows(fc1, 0, f), hp + "mlp.gate_proj.weight");
    put(rows(fc1, f, f), hp + "mlp.up_proj.weight");
    put(need(native, p + "mlp.linear_fc2.weight", {h, f}), hp + "mlp.down_proj.weight");
  }
  put(need(native, "decoder.final_layernorm.weight", {h}), "model.norm.weight");
  if (!c.tie_word_embeddings) put(rows(need(native, "output_layer.weight", {pv, h}), 0, v), "lm_head.weight");
  return out;
}

HfModel load_hf_folder(const std::string& dir, int divisible_by) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  HfModel m;
  m.config = model_config_from_hf_json(read_text_file(config_path), config_path, divisible_by);
  const SafetensorsFolder hf(dir);
  try {
    m.tensors = hf_to_native(m.config, hf);
  } catch (const Error& e) {
    if (!e.where().file.empty()) throw;
    fail_at(dir, e.message());
  }
  return m;
}

void export_hf_folder(const std::string& dir, const ModelConfig& config, const TensorSet& native, const HfExportOptions& o) {
  const TensorSet hf = native_to_hf(config, native, o.dtype);
  std::vector<TensorView> views;
  // transformers' order: embeddings, layers in order, norm, head (the TensorSet is sorted by name).
  views.push_back(hf.at("model.embed_tokens.weight").view());
  for (int i = 0; i < config.num_layers; ++i) {
    const std::string prefix = fmt::format("model.layers.{}.", i);
    for (const auto& [name, t] : hf)
      if (name.starts_with(prefix)) views.push_back(t.view());
  }
  views.push_back(hf.at("model.norm.weight").view());
  if (hf.count("lm_head.weight")) views.push_back(hf.at("lm_head.weight").view());
  fs::create_directories(dir);
  write_safetensors_folder(dir, views, o.num_shards > 0 ? shard_cap_for(views, o.num_shards) : o.max_shard_bytes);
  const bool remote = has_difflm_remote_code(config);
  for (const detail::RemoteCodeFile& f : detail::difflm_remote_code()) {
    const fs::path path = fs::path(dir) / f.name;
    if (remote) write_file_atomically(path.string(), std::string(f.text));
    else fs::remove(path);  // a causal export over an old DiffLM folder must not keep its code
  }
  write_file_atomically((fs::path(dir) / "config.json").string(), model_config_to_hf_json(config, o.dtype));
  if (!o.tokenizer_dir.empty()) copy_tokenizer_files(o.tokenizer_dir, dir);
}

int copy_tokenizer_files(const std::string& from, const std::string& to) {
  static const char* files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                                "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json", "tekken.json"};
  int n = 0;
  fs::create_directories(to);
  for (const char* f : files) {
    const fs::path src = fs::path(from) / f;
    if (!fs::exists(src)) continue;
    write_file_atomically((fs::path(to) / f).string(), read_text_file(src.string()));
    ++n;
  }
  return n;
}

}  // namespace dlm::ckpt
