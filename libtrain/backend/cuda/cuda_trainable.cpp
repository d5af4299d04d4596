// CudaModel behind the trainer's TrainableModel (with DeviceTraining: the optimizer stays on the GPU) and
// behind the samplers' LogitsFn / GreedyFn (device.h).
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/device.h"

namespace dlm::train {
namespace {

CudaBatch cuda_batch(const ModelBatch& b) {
  return {b.batch, b.seq, b.causal, b.input_ids, b.labels, b.position_ids, b.weights};
}

class CudaTrainable final : public TrainableModel, public DeviceTraining {
 public:
  CudaTrainable(const ckpt::ModelConfig& config, std::uint64_t seed)
      : model_(config), specs_(ckpt::model_tensors(model_.config())), options_{} {
    model_.init(seed);
  }

  // Host copies of the master weights, refreshed on each call (checkpoints only: never per step).
  std::vector<ParamRef> parameters() override {
    host_.resize(specs_.size());
    std::vector<ParamRef> refs;
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      host_[i] = model_.export_parameter(specs_[i].name);
      refs.push_back({specs_[i].name, host_[i], {}, !specs_[i].is_norm, specs_[i].shape});
    }
    return refs;
  }
  void zero_grad() override { model_.zero_grad(); }
  double forward_backward(const ModelBatch& batch) override { return model_.forward_backward(cuda_batch(batch)); }
  double forward_loss(const ModelBatch& batch) override { return model_.forward_loss(cuda_batch(batch)); }
  DeviceTraining* device_training() override { return this; }

  double grad_norm() override { return model_.grad_norm(); }
  void step(const AdamWOptions& options, double lr, double max_norm) override {
    options_ = options;
    model_.apply_adamw(options, lr, max_norm);
  }
  AdamW optimizer_state() override {
    AdamW state(options_);
    state.set_steps(model_.optimizer_steps());
    // As the host AdamW: no moments before the first step.
    if (model_.optimizer_steps() > 0)
      for (const auto& s : specs_) {
        state.exp_avg().push_back(model_.export_exp_avg(s.name));
        state.exp_avg_sq().push_back(model_.export_exp_avg_sq(s.name));
      }
    return state;
  }
  void load_optimizer_state(const AdamW& state) override {
    options_ = state.options();
    if (!state.exp_avg().empty()) {
      if (state.exp_avg().size() != specs_.size() || state.exp_avg_sq().size() != specs_.size())
        fail(fmt::format("optimizer state: {} moment tensors for {} parameters", state.exp_avg().size(), specs_.size()));
      for (std::size_t i = 0; i < specs_.size(); ++i)
        model_.import_moments(specs_[i].name, state.exp_avg()[i], state.exp_avg_sq()[i]);
    }
    model_.set_optimizer_steps(state.steps());
  }
  void commit_parameters() override {
    if (host_.size() != specs_.size()) fail("commit_parameters: no host copies (call parameters() first)");
    for (std::size_t i = 0; i < specs_.size(); ++i) model_.import_parameter(specs_[i].name, host_[i]);
    host_.clear();
    host_.shrink_to_fit();
  }
  DeviceSpan gradient_buffer() override {
    const auto s = model_.gradient_buffer();
    return {s.name, s.data, s.numel};
  }
  DeviceSpan parameter_buffer() override {
    const auto s = model_.parameter_buffer();
    return {s.name, s.data, s.numel};
  }
  void* stream() override { return model_.stream(); }
  void parameters_written() override { model_.refresh_bf16_weights(); }

 private:
  CudaModel model_;
  std::vector<ckpt::TensorSpec> specs_;
  std::vector<std::vector<float>> host_;
  AdamWOptions options_;
};

// Rows of a left-padded batch grouped by their padding: each group runs as one batch without its pad
// columns (never attended, so the other positions' values are those of the padded run).
std::map<std::int64_t, std::vector<std::int64_t>> rows_by_padding(const SequenceBatch& b) {
  std::map<std::int64_t, std::vector<std::int64_t>> groups;
  for (std::int64_t r = 0; r < b.rows; ++r) {
    const auto* a = b.attention.data() + r * b.len;
    const std::int64_t pad = std::find(a, a + b.len, std::uint8_t{1}) - a;
    if (pad == b.len || std::find(a + pad, a + b.len, std::uint8_t{0}) != a + b.len)
      fail(fmt::format("CUDA sampling: row {}'s attention is not left padding followed by tokens", r));
    groups[pad].push_back(r);
  }
  return groups;
}

// Runs `run(rows, len, ids, positions)` per padding group and scatters its per-position results (width
// values each) into `out` [rows, len, width]; pad positions read 0.
template <typename T, typename Run>
void by_group(const SequenceBatch& b, std::int64_t width, std::vector<T>& out, Run run) {
  out.assign(static_cast<std::size_t>(b.rows * b.len * width), T{});
  for (const auto& [pad, rows] : rows_by_padding(b)) {
    const std::int64_t len = b.len - pad, g = static_cast<std::int64_t>(rows.size());
    std::vector<std::int32_t> ids, positions;
    for (std::int64_t r : rows) {
      ids.insert(ids.end(), b.ids.begin() + r * b.len + pad, b.ids.begin() + (r + 1) * b.len);
      if (!b.position_ids.empty())
        positions.insert(positions.end(), b.position_ids.begin() + r * b.len + pad, b.position_ids.begin() + (r + 1) * b.len);
    }
    const std::vector<T> got = run(g, len, ids, positions);
    for (std::int64_t k = 0; k < g; ++k)
      std::copy_n(got.begin() + k * len * width, len * width, out.begin() + (rows[k] * b.len + pad) * width);
  }
}

}  // namespace

std::unique_ptr<TrainableModel> make_cuda_trainable(const ckpt::ModelConfig& config, std::uint64_t seed) {
  return std::make_unique<CudaTrainable>(config, seed);
}

CudaSampling make_cuda_sampling(const ckpt::ModelConfig& config, const ckpt::TensorSet& weights) {
  auto model = std::make_shared<CudaModel>(config);
  for (const auto& spec : ckpt::model_tensors(model->config())) {
    auto it = weights.find(spec.name);
    if (it == weights.end()) fail(fmt::format("CUDA sampling: the checkpoint has no tensor {}", spec.name));
    if (it->second.dtype != ckpt::TensorDType::kFloat32)
      fail(fmt::format("CUDA sampling: tensor {} is not fp32", spec.name));
    model->import_parameter(spec.name, it->second.f32());
  }
  const bool causal = config.attention_mask == ckpt::AttentionMask::kCausal;
  const std::int64_t vocab = config.vocab_size;
  CudaSampling s;
  s.vocab = vocab;
  s.parameters = model->parameter_count();
  s.logits = [model, causal, vocab](const SequenceBatch& b, std::vector<float>& logits) {
    by_group<float>(b, vocab, logits, [&](std::int64_t rows, std::int64_t len, const auto& ids, const auto& positions) {
      return model->forward_logits(rows, len, causal, ids, positions);
    });
  };
  s.greedy = [model, causal](const SequenceBatch& b, std::vector<std::int32_t>& tokens, std::vector<float>& confidence) {
    // Tokens and confidences of one group come from one call: keep the confidences beside the tokens.
    std::vector<float> conf_group;
    by_group<std::int32_t>(b, 1, tokens, [&](std::int64_t rows, std::int64_t len, const auto& ids, const auto& positions) {
      std::vector<std::int32_t> t;
      std::vector<float> c;
      model->greedy_tokens(rows, len, causal, ids, positions, t, c);
      conf_group.insert(conf_group.end(), c.begin(), c.end());
      return t;
    });
    // The same walk for the confidences, from the values kept above, group by group.
    std::size_t at = 0;
    by_group<float>(b, 1, confidence, [&](std::int64_t rows, std::int64_t len, const auto&, const auto&) {
      std::vector<float> c(conf_group.begin() + static_cast<std::ptrdiff_t>(at),
                           conf_group.begin() + static_cast<std::ptrdiff_t>(at + rows * len));
      at += static_cast<std::size_t>(rows * len);
      return c;
    });
  };
  s.keep_alive = model;
  return s;
}

}  // namespace dlm::train
