// CudaModel behind the trainer's TrainableModel (with DeviceTraining: the optimizer stays on the GPU) and
// behind the samplers' LogitsFn / GreedyFn (device.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/device.h"
#include "dlm/train/device_pipeline.h"
#include "dlm/train/model.h"
#include "kernels.h"

namespace dlm::train {
namespace {

CudaBatch cuda_batch(const ModelBatch& b) {
  return {b.batch, b.seq, b.causal, b.input_ids, b.labels, b.position_ids, b.weights};
}

// CudaModel's stage calls as the pipeline schedule drives them.
class CudaStage final : public PipelineStage {
 public:
  explicit CudaStage(CudaModel& model) : m_(model) {}
  std::size_t boundary_elements() const override {
    return static_cast<std::size_t>(m_.stage_rows() * m_.config().hidden_size);
  }
  void* input(int slot) override { return m_.stage_input(slot); }
  const void* output() const override { return m_.stage_output(); }
  float* output_grad() override { return m_.stage_output_grad(); }
  const float* input_grad() const override { return m_.stage_input_grad(); }
  void forward(int mb, int slot, bool training) override { m_.forward_stage(mb, slot, training); }
  void backward(int mb, int slot) override { m_.backward_stage(mb, slot); }
  void* stream() override { return m_.stream(); }

 private:
  CudaModel& m_;
};

// The whole model, or one rank's part of a TP/PP replica (then the micro-batches of a step run through
// the GPU pipeline schedule, and the norm and shared gradients are summed over the replica's ranks).
class CudaTrainable final : public TrainableModel, public DeviceTraining {
 public:
  CudaTrainable(const ckpt::ModelConfig& config, std::uint64_t seed, const CudaParallelGroups& parallel)
      : parallel_(parallel), model_(config, shard_of(config, parallel)), options_{} {
    model_.init(seed);
  }
  ~CudaTrainable() override {
    if (zeros_) cudaFree(zeros_);
  }

  // Host copies of the master weights, refreshed on each call (checkpoints only: never per step); whole on
  // every rank, also when each holds only its range.
  std::vector<ParamRef> parameters() override {
    const auto& specs = model_.tensors();
    host_.resize(specs.size());
    std::vector<ParamRef> refs;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      host_[i] = model_.export_parameter(specs[i].name);
      sum_shards(host_[i]);
      refs.push_back({specs[i].name, host_[i], {}, !specs[i].is_norm, specs[i].global_shape, specs[i].saved});
    }
    return refs;
  }
  void zero_grad() override { model_.zero_grad(); }
  double forward_backward(const ModelBatch& batch) override { return forward_backward_all(std::span(&batch, 1)); }
  double forward_loss(const ModelBatch& batch) override { return forward_loss_all(std::span(&batch, 1)); }
  double forward_backward_all(std::span<const ModelBatch> batches) override { return run(batches, true); }
  double forward_loss_all(std::span<const ModelBatch> batches) override { return run(batches, false); }
  DeviceTraining* device_training() override { return this; }

  void finish_gradients() override {
    if (sharded()) {
      // The distributed optimizer: each data-parallel rank gets the sum of its range (in place).
      const auto range = model_.optimizer_range();
      float* grads = model_.gradient_buffer().data;
      parallel_.data->reduce_scatter(grads, grads + range.offset, static_cast<std::size_t>(range.numel),
                                     DeviceElement::kF32, model_.stream());
    }
    if (!model_parallel()) return complete();
    const auto& specs = model_.tensors();
    const auto grads = model_.gradient_buffers();
    // Replicated norms whose gradient each tensor rank has in part.
    const int tp = model_.shard().layout.tp;
    for (std::size_t i = 0; i < specs.size(); ++i)
      if (gradient_summed_over_tensor_group(specs[i].name, specs[i].is_norm, tp, parallel_.sequence_parallel))
        parallel_.tensor->all_reduce(grads[i].data, static_cast<std::size_t>(grads[i].numel), DeviceElement::kF32,
                                     model_.stream());
    // Tied embeddings over several stages: the first stage's table and the last's replica add their
    // gradients (Megatron's embedding group); stages between contribute zeros.
    if (parallel_.pipeline && model_.config().tie_word_embeddings) {
      const std::size_t n = embedding_rows();
      float* mine = nullptr;
      for (std::size_t i = 0; i < specs.size(); ++i)
        if (specs[i].name == "embedding.word_embeddings.weight") mine = grads[i].data;
      if (!mine) {
        if (!zeros_) {
          cuda::check_cuda(cudaMalloc(reinterpret_cast<void**>(&zeros_), n * sizeof(float)), "tied-embedding zeros");
          cuda::check_cuda(cudaMemsetAsync(zeros_, 0, n * sizeof(float), static_cast<cudaStream_t>(model_.stream())),
                           "tied-embedding zeros");
        }
        mine = zeros_;
      }
      parallel_.pipeline->all_reduce(mine, n, DeviceElement::kF32, model_.stream());
      if (mine == zeros_)
        cuda::check_cuda(cudaMemsetAsync(zeros_, 0, n * sizeof(float), static_cast<cudaStream_t>(model_.stream())),
                         "tied-embedding zeros");
    }
    complete();
  }
  bool reports() const override {
    return !parallel_.host || (parallel_.host->coords.tensor == 0 && parallel_.host->coords.pipeline == 0);
  }
  void sum_over_model(std::span<double> values) override {
    if (!parallel_.host) return;
    if (parallel_.host->config.tensor > 1) parallel_.host->tensor->all_reduce(values);
    if (parallel_.host->config.pipeline > 1) parallel_.host->pipeline->all_reduce(values);
  }

  double grad_norm() override {
    double sumsq = model_.grad_sumsq();
    if (parallel_.host) {
      sum_over_model(std::span<double>(&sumsq, 1));
      if (sharded()) parallel_.host->data->all_reduce(std::span<double>(&sumsq, 1));  // the ranges' sums
      model_.set_grad_sumsq(sumsq);
    }
    return std::sqrt(sumsq);
  }
  void step(const AdamWOptions& options, double lr, double max_norm) override {
    options_ = options;
    model_.apply_adamw(options, lr, max_norm);
    if (sharded()) {
      // Every rank's updated bf16 range (and norm weights) to every rank. Completed here, not at the next
      // forward: the host must never synchronize a stream that holds collectives (a lost peer would hang it).
      model_.share_updated_weights(*parallel_.data);
      complete();
    }
  }
  int optimizer_shards() const override { return model_.shard().optimizer_shards; }
  AdamW optimizer_state() override {
    AdamW state(options_);
    state.set_steps(model_.optimizer_steps());
    // As the host AdamW: no moments before the first step.
    if (model_.optimizer_steps() > 0)
      for (const auto& s : model_.tensors()) {
        state.exp_avg().push_back(model_.export_exp_avg(s.name));
        state.exp_avg_sq().push_back(model_.export_exp_avg_sq(s.name));
        sum_shards(state.exp_avg().back());
        sum_shards(state.exp_avg_sq().back());
      }
    return state;
  }
  void load_optimizer_state(const AdamW& state) override {
    const auto& specs = model_.tensors();
    options_ = state.options();
    if (!state.exp_avg().empty()) {
      if (state.exp_avg().size() != specs.size() || state.exp_avg_sq().size() != specs.size())
        fail(fmt::format("optimizer state: {} moment tensors for {} parameters", state.exp_avg().size(), specs.size()));
      for (std::size_t i = 0; i < specs.size(); ++i)
        model_.import_moments(specs[i].name, state.exp_avg()[i], state.exp_avg_sq()[i]);
    }
    model_.set_optimizer_steps(state.steps());
  }
  void commit_parameters() override {
    const auto& specs = model_.tensors();
    if (host_.size() != specs.size()) fail("commit_parameters: no host copies (call parameters() first)");
    for (std::size_t i = 0; i < specs.size(); ++i) model_.import_parameter(specs[i].name, host_[i]);
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
  std::vector<float> gradient(std::string_view name) override { return model_.export_gradient(name); }

 private:
  bool model_parallel() const {
    return parallel_.host && (parallel_.host->config.tensor > 1 || parallel_.host->config.pipeline > 1);
  }
  bool sharded() const { return model_.shard().optimizer_shards > 1; }
  // A tensor each optimizer shard exported as its range and zeros elsewhere becomes the whole tensor on every
  // rank (summed over the data-parallel group: x + 0 = x exactly).
  void sum_shards(std::vector<float>& values) {
    if (sharded()) parallel_.host->data->all_reduce(std::span<float>(values));
  }
  static CudaShard shard_of(const ckpt::ModelConfig& config, const CudaParallelGroups& p) {
    if (!p.host) return {};
    const ParallelConfig& c = p.host->config;
    if ((c.tensor > 1 && !p.tensor) || (c.pipeline > 1 && !p.pipeline))
      fail("GPU model parallelism needs the tensor and pipeline groups over device memory");
    const bool distributed = p.distributed_optimizer && c.data > 1;
    if (distributed && (!p.data || p.data->size() != c.data || p.data->rank() != p.host->coords.data))
      fail("the distributed optimizer on the GPU needs the data-parallel group over device memory");
    CudaShard shard;
    if (distributed) shard.optimizer_shards = c.data, shard.optimizer_rank = p.host->coords.data;
    shard.layout = ckpt::ParallelLayout{c.tensor, c.pipeline, c.data, {}};
    shard.layout.validate(config);
    shard.tensor_rank = p.host->coords.tensor;
    shard.stage = p.host->coords.pipeline;
    shard.sequence_parallel = p.sequence_parallel;
    shard.tensor = c.tensor > 1 ? p.tensor : nullptr;
    return shard;
  }
  std::size_t embedding_rows() const {
    const auto& c = model_.config();
    return static_cast<std::size_t>(c.padded_vocab_size() / model_.shard().layout.tp * c.hidden_size);
  }
  // Every transfer of the step has completed (a lost rank is named here, within the timeout).
  void complete() {
    if (parallel_.tensor) parallel_.tensor->complete();
    if (parallel_.pipeline) parallel_.pipeline->complete();
    if (sharded()) parallel_.data->complete();
  }
  double run(std::span<const ModelBatch> batches, bool training) {
    if (!model_parallel()) {
      double loss = 0;
      for (const auto& b : batches)
        loss += training ? model_.forward_backward(cuda_batch(b)) : model_.forward_loss(cuda_batch(b));
      return loss;
    }
    for (std::size_t k = 0; k < batches.size(); ++k) model_.upload_inputs(static_cast<int>(k), cuda_batch(batches[k]));
    const int stages = parallel_.host->config.pipeline, M = static_cast<int>(batches.size());
    model_.reserve_slots(training ? std::min(stages - parallel_.host->coords.pipeline, M) : 1);
    CudaStage stage(model_);
    run_pipeline_1f1b(stage, parallel_.pipeline, static_cast<int>(batches.size()), training);
    complete();
    double loss = model_.take_loss();  // the last stage's; every other stage's is 0
    if (parallel_.host->config.pipeline > 1) parallel_.host->pipeline->all_reduce(std::span<double>(&loss, 1));
    return loss;
  }

  CudaParallelGroups parallel_;
  CudaModel model_;
  std::vector<std::vector<float>> host_;
  AdamWOptions options_;
  float* zeros_ = nullptr;
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

std::unique_ptr<TrainableModel> make_cuda_trainable(const ckpt::ModelConfig& config, std::uint64_t seed,
                                                    const CudaParallelGroups& parallel) {
  return std::make_unique<CudaTrainable>(config, seed, parallel);
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
  s.greedy = [model, causal](const SequenceBatch& b, std::int64_t first, std::int64_t end,
                              std::vector<std::int32_t>& tokens, std::vector<float>& confidence) {
    // Tokens and confidences of one group come from one call: keep the confidences beside the tokens.
    std::vector<float> conf_group;
    by_group<std::int32_t>(b, 1, tokens, [&](std::int64_t rows, std::int64_t len, const auto& ids, const auto& positions) {
      std::vector<std::int32_t> t;
      std::vector<float> c;
      // The group's columns start after its padding: the window moves left by it, clipped at 0.
      const std::int64_t pad = b.len - len;
      const std::int64_t lo = std::max<std::int64_t>(first - pad, 0), hi = std::max<std::int64_t>(end - pad, lo + 1);
      model->greedy_tokens(rows, len, causal, ids, positions, t, c, {lo, std::min(hi, len)});
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
