// Megatron's argparse.Namespace -> ModelConfig (megatron/training/arguments.py's names) and JSON.
#include "megatron_args.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::ckpt::detail {

using Kind = PickleValue::Kind;

bool megatron_int_arg(const PickleValue& args, const char* key, std::int64_t& out) {
  const PickleValue* v = args.get(key);
  if (!v || !v->is(Kind::kInt)) return false;
  out = v->i;
  return true;
}

namespace {

class Args {
 public:
  Args(const PickleValue& args, const std::string& file) : a_(args), file_(file) {
    if (!a_.is(Kind::kDict)) fail_at(file_, "checkpoint 'args' is not a namespace");
  }
  const PickleValue* find(const char* key) const {
    const PickleValue* v = a_.get(key);
    return v && !v->is(Kind::kNone) ? v : nullptr;
  }
  std::int64_t integer(const char* key) const {
    const PickleValue* v = find(key);
    if (!v || !v->is(Kind::kInt)) fail_at(file_, fmt::format("checkpoint args.{} is missing or not an integer", key));
    return v->i;
  }
  std::int64_t integer(const char* key, std::int64_t fallback) const { return find(key) ? integer(key) : fallback; }
  double number(const char* key, double fallback) const {
    const PickleValue* v = find(key);
    if (!v) return fallback;
    if (v->is(Kind::kFloat)) return v->f;
    if (v->is(Kind::kInt)) return static_cast<double>(v->i);
    fail_at(file_, fmt::format("checkpoint args.{} is not a number", key));
  }
  bool flag(const char* key, bool fallback) const {
    const PickleValue* v = find(key);
    if (!v) return fallback;
    if (!v->is(Kind::kBool)) fail_at(file_, fmt::format("checkpoint args.{} is not a bool", key));
    return v->b;
  }
  std::string text(const char* key, const std::string& fallback) const {
    const PickleValue* v = find(key);
    return v && v->is(Kind::kString) ? v->s : fallback;
  }
  void refuse(bool bad, const std::string& why) const {
    if (bad) fail_at(file_, fmt::format("Megatron model has {}, which dlm's model does not", why));
  }

 private:
  const PickleValue& a_;
  const std::string& file_;
};

}  // namespace

ModelConfig model_config_from_megatron_args(const PickleValue& args, int tp, const std::string& file) {
  const Args a(args, file);
  a.refuse(!a.flag("swiglu", false), "a non-gated MLP (args.swiglu is false)");
  a.refuse(a.text("normalization", "LayerNorm") != "RMSNorm", fmt::format("normalization {}", a.text("normalization", "LayerNorm")));
  a.refuse(a.flag("add_bias_linear", true), "linear biases (args.add_bias_linear)");
  a.refuse(a.flag("add_qkv_bias", false), "QKV biases (args.add_qkv_bias)");
  a.refuse(a.text("position_embedding_type", "learned_absolute") != "rope",
           fmt::format("position embeddings '{}' (dlm uses rope)", a.text("position_embedding_type", "learned_absolute")));
  a.refuse(a.integer("num_experts", 0) > 0, "experts (args.num_experts)");
  ModelConfig c;
  c.num_layers = static_cast<int>(a.integer("num_layers"));
  c.hidden_size = static_cast<int>(a.integer("hidden_size"));
  c.num_attention_heads = static_cast<int>(a.integer("num_attention_heads"));
  c.ffn_hidden_size = static_cast<int>(a.integer("ffn_hidden_size", 4 * std::int64_t{c.hidden_size}));
  c.num_query_groups = a.flag("group_query_attention", false) ? static_cast<int>(a.integer("num_query_groups")) : c.num_attention_heads;
  c.kv_channels = static_cast<int>(a.integer("kv_channels", c.hidden_size / std::max(1, c.num_attention_heads)));
  // Megatron's padding multiple is make_vocab_size_divisible_by * TP (training/tokenizer's
  // _vocab_size_with_padding); args.vocab_size is the tokenizer's size when it was given.
  const std::int64_t padded = a.integer("padded_vocab_size");
  c.make_vocab_size_divisible_by = static_cast<int>(a.integer("make_vocab_size_divisible_by", 128) * tp);
  c.vocab_size = a.integer("vocab_size", padded);
  if (c.padded_vocab_size() != padded) c.vocab_size = padded;
  if (padded % c.make_vocab_size_divisible_by) c.make_vocab_size_divisible_by = 1;
  c.max_position_embeddings = static_cast<int>(a.integer("max_position_embeddings", a.integer("seq_length", 2048)));
  c.rotary_base = a.number("rotary_base", 10000.0);
  c.norm_epsilon = a.number("norm_epsilon", 1e-5);
  c.qk_layernorm = a.flag("qk_layernorm", false);
  c.tie_word_embeddings = !a.flag("untie_embeddings_and_output_weights", false);
  c.init_method_std = a.number("init_method_std", 0.02);
  const std::string mask = a.text("attention_mask_type", a.text("attn_mask_type", "causal"));
  c.attention_mask = mask == "no_mask" || mask == "bidirectional" ? AttentionMask::kBidirectional : AttentionMask::kCausal;
  std::int64_t id = 0;
  if (megatron_int_arg(args, "mask_token_id", id)) c.mask_token_id = static_cast<std::int32_t>(id);
  try {
    c.validate();
  } catch (const Error& e) {
    fail_at(file, "checkpoint args: " + e.message());
  }
  return c;
}

namespace {

nlohmann::json to_json(const PickleValue& v, int depth, std::size_t& budget) {
  using nlohmann::json;
  if (depth > 32) return "<nested too deep>";
  if (budget == 0) return "<truncated>";
  budget -= std::min(budget, 1 + v.s.size());
  switch (v.kind) {
    case Kind::kNone: return nullptr;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i;
    case Kind::kFloat: return std::isfinite(v.f) ? json(v.f) : json(fmt::format("{}", v.f));
    case Kind::kString: return v.s;  // invalid UTF-8 is replaced when dumped
    case Kind::kBytes: return fmt::format("<{} bytes>", v.s.size());
    case Kind::kList:
    case Kind::kTuple: {
      json out = json::array();
      for (const PickleValue* x : v.items) out.push_back(to_json(*x, depth + 1, budget));
      return out;
    }
    case Kind::kDict: {
      json out = json::object();
      for (const auto& [k, x] : v.entries) {
        budget -= std::min(budget, k->s.size());  // keys are written too
        // Non-string keys are named, not rendered: a rendered key is escaped again at each level.
        const std::string key = k->is(Kind::kString) ? k->s : k->is(Kind::kInt) ? std::to_string(k->i) : "<key>";
        out[key] = to_json(*x, depth + 1, budget);
      }
      return out;
    }
    case Kind::kGlobal: return v.s;
    case Kind::kStorage: return fmt::format("<storage {}>", v.s);
    case Kind::kTensor: return fmt::format("<tensor {} [{}]>", torch_dtype_name(v.dtype), fmt::join(v.shape, ", "));
    case Kind::kObject: return fmt::format("{}{}", v.s, v.args ? to_json(*v.args, depth + 1, budget).dump(-1, ' ', false, json::error_handler_t::replace) : "");
  }
  return nullptr;
}

}  // namespace

nlohmann::json pickle_to_json(const PickleValue& v) {
  std::size_t budget = std::size_t{1} << 20;
  return to_json(v, 0, budget);
}

}  // namespace dlm::ckpt::detail
