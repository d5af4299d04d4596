// Model behind the trainer's TrainableModel and the samplers' LogitsFn.
#include "dlm/train/model_adapters.h"

#include <limits>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train {

namespace {

class TrainableTransformer final : public TrainableModel {
 public:
  explicit TrainableTransformer(Model& model) : model_(model) {
    for (const auto& p : model_.parameters()) refs_.push_back(host_param_ref(model_.backend(), p));
  }
  std::vector<ParamRef> parameters() override { return refs_; }
  void zero_grad() override { model_.zero_grad(); }
  double forward_backward(const ModelBatch& batch) override { return run(batch, true); }
  double forward_backward_all(std::span<const ModelBatch> batches) override {
    double loss = 0;
    for (std::size_t i = 0; i < batches.size(); ++i) {
      // The last micro-batch's backward finishes each gradient: only then may its bucket be reduced.
      if (hook_ && i + 1 == batches.size()) model_.set_gradient_hook(hook_);
      loss += run(batches[i], true);
    }
    model_.set_gradient_hook({});
    return loss;
  }
  void set_gradient_ready_hook(std::function<void(std::size_t)> hook) override { hook_ = std::move(hook); }
  MoeStepSums take_moe_sums() override { return model_.take_moe_sums(); }
  double forward_loss(const ModelBatch& batch) override { return run(batch, false); }

 private:
  double run(const ModelBatch& batch, bool backward) {
    model_.forward(model_input(batch));
    const double loss = weighted_loss(batch.weights, model_.cross_entropy(batch.labels));
    if (backward) model_.backward(batch.weights, batch.router_loss_weight);
    return loss;
  }

  Model& model_;
  std::vector<ParamRef> refs_;
  std::function<void(std::size_t)> hook_;
};

}  // namespace

ModelInput model_input(const ModelBatch& batch) {
  ModelInput in;
  in.batch = batch.batch;
  in.seq = batch.seq;
  in.ids = batch.input_ids;
  in.positions = batch.position_ids;
  in.attention = batch.causal ? AttentionKind::kCausal : AttentionKind::kBidirectional;
  return in;
}

double weighted_loss(std::span<const float> weights, std::span<const float> ce) {
  if (weights.size() != ce.size()) fail(fmt::format("model: {} loss weights for {} positions", weights.size(), ce.size()));
  double loss = 0;
  for (std::size_t i = 0; i < ce.size(); ++i) loss += double(weights[i]) * ce[i];
  return loss;
}

ParamRef host_param_ref(Backend& backend, const Parameter& p) {
  const std::span<float> value = backend.host_f32(p.value), grad = backend.host_f32(p.grad);
  if (value.empty() || grad.empty())
    fail(fmt::format("model: the {} backend's parameters are not host fp32 memory; its optimizer must run there",
                     backend.name()));
  return {p.spec.name, value, grad, !p.spec.is_norm, p.shard.global_shape, p.in_grad_norm};
}

std::unique_ptr<TrainableModel> make_trainable_model(Model& model) {
  return std::make_unique<TrainableTransformer>(model);
}

namespace {

// The model's input for a sampler's batch: its ids, position ids, key padding, the config's attention.
ModelInput sampling_input(const Model& model, const SequenceBatch& batch) {
  ModelInput in;
  in.batch = batch.rows;
  in.seq = batch.len;
  in.ids = batch.ids;
  in.positions = batch.position_ids;
  in.key_valid = batch.attention;
  in.attention = model.default_attention();
  return in;
}

// Logits to the host, the padded vocabulary's columns -inf.
void host_logits(const Model& model, const Tensor& out, std::vector<float>& logits) {
  const std::int64_t vocab = model.config().vocab_size, width = model.config().padded_vocab_size();
  logits.resize(static_cast<std::size_t>(out.numel()));
  model.backend().copy_to_host(out, logits);
  for (std::int64_t r = 0; r < out.numel() / width; ++r)
    for (std::int64_t j = vocab; j < width; ++j) logits[r * width + j] = -std::numeric_limits<float>::infinity();
}

}  // namespace

LogitsFn make_logits_fn(Model& model) {
  return [&model](const SequenceBatch& batch, std::vector<float>& logits) {
    host_logits(model, model.forward(sampling_input(model, batch)), logits);
  };
}

CachedLogitsModel make_cached_logits_model(Model& model) {
  CachedLogitsModel m;
  m.full = [&model](const SequenceBatch& batch, std::vector<float>& logits) {
    host_logits(model, model.forward_storing_kv(sampling_input(model, batch)), logits);
  };
  m.window = [&model](const SequenceBatch& batch, std::int64_t first, std::int64_t end, std::vector<float>& logits) {
    host_logits(model, model.forward_window(sampling_input(model, batch), first, end), logits);
  };
  return m;
}

}  // namespace dlm::train
