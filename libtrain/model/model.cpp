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

Model::Model(ckpt::ModelConfig config, Backend& backend) : config_(std::move(config)), backend_(backend) {
  check_config(config_);
  std::map<std::string, int> index;
  for (auto& spec : ckpt::model_tensors(config_)) {
    index[spec.name] = static_cast<int>(params_.size());
    Parameter p{spec, backend_.alloc(spec.shape, DType::kF32), backend_.alloc(spec.shape, DType::kF32)};
    backend_.zero(p.grad);
    params_.push_back(std::move(p));
  }
  auto at = [&](int layer, const char* suffix) {
    auto it = index.find(fmt::format("decoder.layers.{}.{}", layer, suffix));
    return it == index.end() ? -1 : it->second;
  };
  for (int i = 0; i < config_.num_layers; ++i) {
    Layer l;
    l.norm1 = at(i, "self_attention.linear_qkv.layer_norm_weight");
    l.qkv = at(i, "self_attention.linear_qkv.weight");
    l.q_norm = at(i, "self_attention.q_layernorm.weight");
    l.k_norm = at(i, "self_attention.k_layernorm.weight");
    l.proj = at(i, "self_attention.linear_proj.weight");
    l.norm2 = at(i, "mlp.linear_fc1.layer_norm_weight");
    l.fc1 = at(i, "mlp.linear_fc1.weight");
    l.fc2 = at(i, "mlp.linear_fc2.weight");
    layers_.push_back(l);
  }
}

Model::~Model() = default;

AttentionKind Model::default_attention() const {
  return config_.attention_mask == ckpt::AttentionMask::kCausal ? AttentionKind::kCausal
                                                                : AttentionKind::kBidirectional;
}

void Model::init(std::uint64_t seed) {
  // Box-Muller on counter-based uniforms: element pair e of tensor t is a pure function of (seed, t, e).
  constexpr std::uint32_t kInitDomain = 0x494e4954;  // "INIT"
  const CounterRng rng(seed);
  for (std::size_t t = 0; t < params_.size(); ++t) {
    std::vector<float> host(static_cast<std::size_t>(params_[t].value.numel()));
    if (params_[t].spec.is_norm) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else {
      for (std::size_t e = 0; e < host.size(); e += 2) {
        const auto sub = static_cast<std::uint32_t>(e / 2);
        const double u1 = rng.uniform_open0(kInitDomain, t, sub);
        const double u2 = rng.uniform(kInitDomain + 1, t, sub);
        const double radius = config_.init_method_std * std::sqrt(-2.0 * std::log(u1));
        host[e] = static_cast<float>(radius * std::cos(2 * std::numbers::pi * u2));
        if (e + 1 < host.size()) host[e + 1] = static_cast<float>(radius * std::sin(2 * std::numbers::pi * u2));
      }
    }
    backend_.copy_from_host(params_[t].value, host);
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
    if (it->second.shape != p.spec.shape)
      fail(fmt::format("model: tensor '{}' has shape [{}], expected [{}]", p.spec.name,
                       fmt::join(it->second.shape, ", "), fmt::join(p.spec.shape, ", ")));
    backend_.copy_from_host(p.value, it->second.f32());
  }
  for (const auto& [name, tensor] : weights) {
    bool known = false;
    for (const auto& p : params_) known = known || p.spec.name == name;
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
