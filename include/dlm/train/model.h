// Model: the Llama/Qwen3-style transformer dlm trains, written once against the backend seam.
//
// Per layer (pre-norm, no biases):
//   a = RMSNorm(x) ; qkv = a Wqkv^T -> q [N,H,D], k, v [N,G,D] (Megatron's fused rows, model_config.h)
//   q, k = RMSNorm per head (QK-norm, Qwen3; optional) ; q, k = RoPE(q, k, positions)
//   x = x + Attention(q, k, v; bidirectional or causal, GQA) Wo^T
//   x = x + (silu(b Wgate^T) * b Wup^T) Wdown^T,  b = RMSNorm(x)
// then logits = RMSNorm(x) Wout^T, Wout = the embedding table when tied. The logits have
// padded_vocab_size() columns; cross_entropy() slices them to vocab_size, so a padded column never
// enters a loss (the logits adapter in model_adapters.h sets them to -inf for samplers).
//
// Parameters and gradients are backend tensors named by the global names of model_tensors(config)
// (the checkpoint's and libckpt's HF mapping's names); host import/export is fp32 by name.
//
// A training step:  model.forward(input); ce = model.cross_entropy(labels);
//                   model.backward(weights);   // d loss / d ce_i, added into every gradient
// forward() keeps its activations until the next forward(); backward() needs the cross_entropy() of the
// same forward.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/tensor.h"
#include "dlm/train/backend.h"

namespace dlm::train {

// One micro-batch on the host, [batch, seq] row-major.
struct ModelInput {
  std::int64_t batch = 0, seq = 0;
  std::span<const std::int32_t> ids;
  std::span<const std::int32_t> positions;  // empty: 0 .. seq-1 in every row
  std::span<const std::uint8_t> key_valid;  // empty: every key visible; 0 = padding, never attended
  AttentionKind attention = AttentionKind::kBidirectional;
};

struct Parameter {
  ckpt::TensorSpec spec;  // global name, shape, is_norm (no weight decay)
  Tensor value, grad;
};

class Model {
 public:
  // Checks the config (check_config) before allocating anything; gradients start at zero, values
  // undefined until init() or import_weights().
  Model(ckpt::ModelConfig config, Backend& backend);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // A dlm::Error naming the field when the shape cannot be built: ModelConfig::validate() plus heads
  // not dividing hidden_size, KV groups not dividing heads.
  static void check_config(const ckpt::ModelConfig& config);
  // A dlm::Error before any compute when the input does not fit: sizes, seq or a position beyond
  // max_position_embeddings, ids outside [0, vocab_size).
  void check_input(const ModelInput& input) const;

  const ckpt::ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  // The config's attention (bidirectional for diffusion models, causal for AR).
  AttentionKind default_attention() const;

  // Megatron's init: every matrix ~ N(0, init_method_std^2) (padded vocabulary rows included), norms
  // 1. Deterministic in `seed`, and each tensor's values depend only on (seed, its name's position).
  void init(std::uint64_t seed);

  // Parameters in model_tensors(config) order; values and gradients stay in the backend.
  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  const Parameter& parameter(std::string_view name) const;  // dlm::Error for an unknown name
  std::int64_t parameter_count() const;
  void zero_grad();

  // Host fp32 copies by global name (shape as model_tensors says).
  void import_parameter(std::string_view name, std::span<const float> values);
  std::vector<float> export_parameter(std::string_view name) const;
  std::vector<float> export_gradient(std::string_view name) const;
  // Every tensor of model_tensors(config), fp32 with its global shape; a missing, extra or misshapen
  // tensor is a dlm::Error naming it.
  void import_weights(const ckpt::TensorSet& weights);
  ckpt::TensorSet export_weights() const;

  // Runs the model; returns the logits [batch * seq, padded_vocab_size()] (backend memory, valid until
  // the next forward).
  const Tensor& forward(const ModelInput& input);
  // Per-token cross-entropy of the last forward's logits against labels [batch * seq] (label < 0:
  // ignored, 0). Host values.
  std::vector<float> cross_entropy(std::span<const std::int32_t> labels);
  // Adds d(sum_i weights_i * ce_i) / d(parameter) into every gradient; weights [batch * seq].
  void backward(std::span<const float> weights);

 private:
  struct Layer;
  struct Activations;
  void allocate_activations(std::int64_t batch, std::int64_t seq);

  ckpt::ModelConfig config_;
  Backend& backend_;
  std::vector<Parameter> params_;
  std::vector<Layer> layers_;
  std::shared_ptr<Activations> acts_;
};

}  // namespace dlm::train
