// Model: configuration checks, parameters by global name, init, host import/export.
#include <cmath>
#include <map>
#include <numbers>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dlm/common/error.h"
#include "dlm/train/philox.h"
#include "model_internal.h"

namespace dlm::train {

void Model::check_config(const ckpt::ModelConfig& c) {
  c.validate();
  if (c.hidden_size % c.num_attention_heads != 0)
    fail(fmt::format("invalid model config: num_attention_heads {} does not divide hidden_size {}",
                     c.num_attention_heads, c.hidden_size));
  if (c.make_vocab_size_divisible_by <= 0)
    fail(fmt::format("invalid model config: make_vocab_size_divisible_by must be positive, got {}",
                     c.make_vocab_size_divisible_by));
  if (!(c.init_method_std >= 0)) fail("invalid model config: init_method_std must not be negative");
}

Model::Model(ckpt::ModelConfig config, Backend& backend, ModelShard shard)
    : config_(std::move(config)), backend_(backend), shard_(std::move(shard)) {
  check_config(config_);
  const auto& layout = shard_.layout;
  layout.validate(config_);
  if (shard_.stage < 0 || shard_.stage >= layout.pp)
    fail(fmt::format("model: pipeline chunk {} outside the layout's {} chunks", shard_.stage, layout.pp));
  const int tp_size = shard_.tensor ? shard_.tensor->size() : 1;
  if (tp_size != layout.tp)
    fail(fmt::format("model: the layout has tensor parallelism {} but the tensor group has {} ranks", layout.tp, tp_size));
  const int tp_rank = shard_.tensor ? shard_.tensor->rank() : 0;
  if ((shard_.expert ? shard_.expert->size() : 1) != layout.ep)
    fail(fmt::format("model: the layout has expert parallelism {} but the expert group has {} ranks", layout.ep,
                     shard_.expert ? shard_.expert->size() : 1));
  const int ep_rank = shard_.expert ? shard_.expert->rank() : 0;
  if (layout.tp == 1) shard_.sequence_parallel = false;  // as Megatron: nothing to split
  const ckpt::LayerRange layers = ckpt::stage_layer_range(config_, layout, shard_.stage);
  first_layer_ = layers.first;
  vocab_begin_ = config_.padded_vocab_size() / layout.tp * tp_rank;

  std::map<std::string, int> global_index, index;
  {
    int i = 0;
    for (const auto& spec : ckpt::model_tensors(config_)) global_index[spec.name] = i++;
  }
  for (auto& s : ckpt::rank_shards(config_, layout, tp_rank, shard_.stage, ep_rank)) {
    index[s.name] = static_cast<int>(params_.size());
    ckpt::TensorSpec spec{s.name, s.local_shape, s.is_norm};
    Parameter p{spec, backend_.alloc(s.local_shape, DType::kF32), backend_.alloc(s.local_shape, DType::kF32), s,
                global_index.at(s.name), true};
    // Replicas are counted once in the gradient norm: norms and MoE routers on tensor rank 0, the tied embedding
    // on the first stage (expert-parallel ranks each count their replica of the dense tensors, as data-parallel
    // ranks do).
    const bool tensor_replica = s.is_norm || s.name.find(".mlp.router.") != std::string::npos;
    p.in_grad_norm = tensor_replica ? tp_rank == 0 : shard_.stage == 0 || s.name != "embedding.word_embeddings.weight";
    backend_.zero(p.grad);
    params_.push_back(std::move(p));
  }
  auto find = [&](const std::string& name) {
    auto it = index.find(name);
    return it == index.end() ? -1 : it->second;
  };
  if (pre_process()) embedding_ = find("embedding.word_embeddings.weight");
  if (post_process()) {
    final_norm_ = find("decoder.final_layernorm.weight");
    output_ = config_.tie_word_embeddings ? find("embedding.word_embeddings.weight") : find("output_layer.weight");
    if (final_norm_ < 0 || output_ < 0) fail("model: the last pipeline chunk lacks the final norm or the output layer");
  }
  if (pre_process() && embedding_ < 0) fail("model: the first pipeline chunk lacks the embedding");
  auto at = [&](int layer, const char* suffix) { return find(fmt::format("decoder.layers.{}.{}", layer, suffix)); };
  for (int i = layers.first; i < layers.first + layers.count; ++i) {
    Layer l;
    l.norm1 = at(i, "self_attention.linear_qkv.layer_norm_weight");
    l.qkv = at(i, "self_attention.linear_qkv.weight");
    l.q_norm = at(i, "self_attention.q_layernorm.weight");
    l.k_norm = at(i, "self_attention.k_layernorm.weight");
    l.proj = at(i, "self_attention.linear_proj.weight");
    if (config_.is_moe_layer(i)) {
      l.norm2 = at(i, "pre_mlp_layernorm.weight");
      l.router = at(i, "mlp.router.weight");
      l.experts_fc1 = at(i, "mlp.experts.linear_fc1.weight");
      l.experts_fc2 = at(i, "mlp.experts.linear_fc2.weight");
      if (config_.moe_shared_expert_intermediate_size > 0) {
        l.fc1 = at(i, "mlp.shared_experts.linear_fc1.weight");
        l.fc2 = at(i, "mlp.shared_experts.linear_fc2.weight");
      }
    } else {
      l.norm2 = at(i, "mlp.linear_fc1.layer_norm_weight");
      l.fc1 = at(i, "mlp.linear_fc1.weight");
      l.fc2 = at(i, "mlp.linear_fc2.weight");
    }
    layers_.push_back(l);
  }
  slots_.resize(1);
}

std::int64_t Model::local_rows(std::int64_t tokens) const {
  return shard_.sequence_parallel ? tokens / shard_.layout.tp : tokens;
}

Model::~Model() = default;

AttentionKind Model::default_attention() const {
  return config_.attention_mask == ckpt::AttentionMask::kCausal ? AttentionKind::kCausal
                                                                : AttentionKind::kBidirectional;
}

void Model::init(std::uint64_t seed) {
  // Box-Muller on counter-based uniforms: element pair e of tensor t is a pure function of (seed, t, e),
  // t the tensor's position in model_tensors(config) and e the element's index in the whole tensor.
  constexpr std::uint32_t kInitDomain = 0x494e4954;  // "INIT"
  const CounterRng rng(seed);
  for (auto& p : params_) {
    auto global = ckpt::Tensor::zeros(p.spec.name, p.shard.global_shape);
    std::span<float> host = global.f32();
    if (p.spec.is_norm) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else {
      const auto t = static_cast<std::uint64_t>(p.global_index);
      for (std::size_t e = 0; e < host.size(); e += 2) {
        const auto sub = static_cast<std::uint32_t>(e / 2);
        const double u1 = rng.uniform_open0(kInitDomain, t, sub);
        const double u2 = rng.uniform(kInitDomain + 1, t, sub);
        const double radius = config_.init_method_std * std::sqrt(-2.0 * std::log(u1));
        host[e] = static_cast<float>(radius * std::cos(2 * std::numbers::pi * u2));
        if (e + 1 < host.size()) host[e + 1] = static_cast<float>(radius * std::sin(2 * std::numbers::pi * u2));
      }
    }
    const ckpt::Tensor local = ckpt::extract_shard(global, p.shard);
    backend_.copy_from_host(p.value, local.f32());
  }
}

const Parameter& Model::parameter(std::string_view name) const {
  for (const auto& p : params_)
    if (p.spec.name == name) return p;
  fail(fmt::format("model: no parameter named '{}'", name));
}

std::int64_t Model::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& p : params_) n += p.value.numel();
  return n;
}

void Model::zero_grad() {
  for (auto& p : params_) backend_.zero(p.grad);
}

void Model::import_parameter(std::string_view name, std::span<const float> values) {
  const Parameter& p = parameter(name);
  if (static_cast<std::int64_t>(values.size()) != p.value.numel())
    fail(fmt::format("model: parameter '{}' has {} elements, got {}", name, p.value.numel(), values.size()));
  backend_.copy_from_host(p.value, values);
}

std::vector<float> Model::export_parameter(std::string_view name) const {
  const Parameter& p = parameter(name);
  std::vector<float> out(static_cast<std::size_t>(p.value.numel()));
  backend_.copy_to_host(p.value, out);
  return out;
}

std::vector<float> Model::export_gradient(std::string_view name) const {
  const Parameter& p = parameter(name);
  std::vector<float> out(static_cast<std::size_t>(p.grad.numel()));
  backend_.copy_to_host(p.grad, out);
  return out;
}

void Model::import_weights(const ckpt::TensorSet& weights) {
  for (const auto& p : params_) {
    auto it = weights.find(p.spec.name);
    if (it == weights.end()) fail(fmt::format("model: weights lack tensor '{}'", p.spec.name));
    if (it->second.shape != p.shard.global_shape)
      fail(fmt::format("model: tensor '{}' has shape [{}], expected [{}]", p.spec.name,
                       fmt::join(it->second.shape, ", "), fmt::join(p.shard.global_shape, ", ")));
    if (it->second.dtype != ckpt::TensorDType::kFloat32) fail(fmt::format("model: tensor '{}' is not fp32", p.spec.name));
    if (p.shard.local_shape == p.shard.global_shape) {
      backend_.copy_from_host(p.value, it->second.f32());
    } else {
      const ckpt::Tensor local = ckpt::extract_shard(it->second, p.shard);
      backend_.copy_from_host(p.value, local.f32());
    }
  }
  const auto all = ckpt::model_tensors(config_);
  for (const auto& [name, tensor] : weights) {
    bool known = false;
    for (const auto& spec : all) known = known || spec.name == name;
    if (!known) fail(fmt::format("model: weights hold tensor '{}', which this model config does not have", name));
  }
}

ckpt::TensorSet Model::export_weights() const {
  ckpt::TensorSet out;
  for (const auto& p : params_) {
    ckpt::Tensor t = ckpt::Tensor::zeros(p.spec.name, p.spec.shape);
    backend_.copy_to_host(p.value, t.f32());
    out.emplace(p.spec.name, std::move(t));
  }
  return out;
}

}  // namespace dlm::train
