// CudaModel behind the trainer's TrainableModel (with DeviceTraining: the optimizer stays on the GPU): the
// whole model, or one rank's chunks of a TP/PP replica (device.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/cuda_grad_reduce.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/device.h"
#include "dlm/train/device_pipeline.h"
#include "dlm/train/model.h"
#include "kernels.h"

namespace dlm::train {
namespace {

CudaBatch cuda_batch(const ModelBatch& b) {
  return {b.batch, b.seq, b.causal, b.input_ids, b.labels, b.position_ids, b.weights, b.router_loss_weight};
}

// CudaModel's stage calls as the pipeline schedule drives them. With `reducer`, the chunk's last backward of
// the step (its `backwards`-th) reduces its gradient buckets as its layers finish.
class CudaStage final : public PipelineStage {
 public:
  explicit CudaStage(CudaModel& model, CudaGradReducer* reducer = nullptr, int backwards = 0)
      : m_(model), reducer_(reducer), backwards_(backwards) {}
  std::size_t boundary_elements() const override {
    return static_cast<std::size_t>(m_.stage_rows() * m_.config().hidden_size);
  }
  void* input(int slot) override { return m_.stage_input(slot); }
  const void* output() const override { return m_.stage_output(); }
  float* output_grad() override { return m_.stage_output_grad(); }
  const float* input_grad() const override { return m_.stage_input_grad(); }
  void forward(int mb, int slot, bool training) override { m_.forward_stage(mb, slot, training); }
  void backward(int mb, int slot) override {
    if (reducer_ && ++done_ == backwards_) reducer_->start();
    m_.backward_stage(mb, slot);
  }
  void* stream() override { return m_.stream(); }

 private:
  CudaModel& m_;
  CudaGradReducer* reducer_;
  int backwards_, done_ = 0;
};

// The whole model, or this rank's chunks of a TP/PP replica: one CudaModel, or with virtual stages one per
// chunk (chunk v is stage v * PP + r, all on one stream). The micro-batches of a step then run through the
// GPU pipeline schedule (1F1B, or interleaved 1F1B over the chunks), and the norm and shared gradients are
// summed over the replica's ranks. Parameters, gradients and optimizer state are the chunks' in chunk order.
class CudaTrainable final : public TrainableModel, public DeviceTraining {
 public:
  CudaTrainable(const ckpt::ModelConfig& config, std::uint64_t seed, const CudaParallelGroups& parallel,
                const CudaOptions& cuda)
      : parallel_(parallel), options_{} {
    const int chunks = parallel.host ? std::max(parallel.virtual_stages, 1) : 1;
    if (chunks > 1 && (!parallel.host || parallel.host->config.pipeline < 2))
      fail("interleaved pipelines need --pipeline-model-parallel-size of at least 2 (as in Megatron)");
    for (int v = 0; v < chunks; ++v) {
      void* stream = chunks_.empty() ? nullptr : chunks_.front()->stream();
      chunks_.push_back(std::make_unique<CudaModel>(config, shard_of(config, parallel, v, chunks, stream), cuda));
      chunks_.back()->set_recompute_layers(parallel.recompute_layers);
      if (parallel.sparse_embedding_grad && !parallel.host && !config.tie_word_embeddings)
        chunks_.back()->set_sparse_embedding_grad(true);
      chunks_.back()->init(seed);
    }
    // Data parallelism with the overlapped all-reduce (not with the distributed optimizer: its reduce-scatter
    // cuts the whole flat buffer into DP ranges, not into layer buckets, and follows the backward).
    if (parallel.host && parallel.overlap_grad_reduce && !parallel.distributed_optimizer &&
        parallel.host->config.data > 1) {
      if (!parallel.data || parallel.data->size() != parallel.host->config.data ||
          parallel.data->rank() != parallel.host->coords.data)
        fail("--overlap-grad-reduce on the GPU needs the data-parallel group over device memory");
      for (auto& c : chunks_)
        reducers_.push_back(std::make_unique<CudaGradReducer>(*c, *parallel.data, parallel.bucket_elements,
                                                              reducers_.empty() ? nullptr : reducers_.front()->stream()));
    }
  }
  ~CudaTrainable() override {
    if (zeros_) cudaFree(zeros_);
  }

  // Host copies of the master weights, refreshed on each call (checkpoints only: never per step); whole on
  // every rank, also when each holds only its range.
  std::vector<ParamRef> parameters() override {
    host_.clear();
    for (auto& c : chunks_)
      for (auto& values : c->export_parameters()) {
        host_.push_back(std::move(values));
        sum_shards(host_.back());
      }
    std::vector<ParamRef> refs;
    std::size_t k = 0;
    for (auto& c : chunks_)
      for (const auto& spec : c->tensors()) {
        refs.push_back({spec.name, host_[k++], {}, !spec.is_norm, spec.global_shape, spec.saved});
        refs.back().expert_parallel = experts_split() && is_expert(spec.name);
      }
    return refs;
  }
  void zero_grad() override {
    for (auto& c : chunks_) c->zero_grad();
    reduced_ = false;
  }
  double forward_backward(const ModelBatch& batch) override { return forward_backward_all(std::span(&batch, 1)); }
  double forward_loss(const ModelBatch& batch) override { return forward_loss_all(std::span(&batch, 1)); }
  double forward_backward_all(std::span<const ModelBatch> batches) override { return run(batches, true); }
  double forward_loss_all(std::span<const ModelBatch> batches) override { return run(batches, false); }
  DeviceTraining* device_training() override { return this; }
  // The phase table of the steps so far with CudaOptions::profile (CudaModel::profile_report: the whole model
  // only), "" without it.
  std::string profile_report() override {
    return chunks_.front()->options().profile ? chunks_.front()->profile_report() : std::string();
  }

  void finish_gradients() override {
    if (!reducers_.empty()) {
      // The buckets the last backward has not reduced (all of them when none ran), then the model's stream
      // waits for every bucket: the tensor group's norm sums and the tied embedding's below add to gradients
      // already summed over the data group, which gives the same sum (all are sums) without a race.
      for (auto& r : reducers_) {
        if (!r->started() && !reduced_) r->start();
        r->finish();
      }
      reduced_ = true;
    }
    if (experts_split()) reduce_over_data_groups();
    if (sharded()) {
      // The distributed optimizer: each data-parallel rank gets the sum of its range (in place), per chunk.
      for (auto& c : chunks_) {
        const auto range = c->optimizer_range();
        float* grads = c->gradient_buffer().data;
        parallel_.data->reduce_scatter(grads, grads + range.offset, static_cast<std::size_t>(range.numel),
                                       DeviceElement::kF32, stream());
      }
    }
    if (!model_parallel()) return complete();
    // Replicated norms whose gradient each tensor rank has in part.
    const int tp = first().shard().layout.tp;
    for (auto& c : chunks_) {
      const auto& specs = c->tensors();
      const auto grads = c->gradient_buffers();
      for (std::size_t i = 0; i < specs.size(); ++i)
        if (gradient_summed_over_tensor_group(specs[i].name, specs[i].is_norm, tp, parallel_.sequence_parallel))
          parallel_.tensor->all_reduce(grads[i].data, static_cast<std::size_t>(grads[i].numel), DeviceElement::kF32,
                                       stream());
    }
    // Tied embeddings over several stages: the first stage's table and the last's replica add their
    // gradients (Megatron's embedding group); ranks holding neither contribute zeros.
    if (parallel_.pipeline && first().config().tie_word_embeddings) {
      const std::size_t n = embedding_rows();
      const auto s = static_cast<cudaStream_t>(stream());
      float* mine = nullptr;
      for (auto& c : chunks_) {
        const auto& specs = c->tensors();
        const auto grads = c->gradient_buffers();
        for (std::size_t i = 0; i < specs.size() && !mine; ++i)
          if (specs[i].name == "embedding.word_embeddings.weight") mine = grads[i].data;
      }
      if (!mine) {
        if (!zeros_) {
          cuda::check_cuda(cudaMalloc(reinterpret_cast<void**>(&zeros_), n * sizeof(float)), "tied-embedding zeros");
          cuda::check_cuda(cudaMemsetAsync(zeros_, 0, n * sizeof(float), s), "tied-embedding zeros");
        }
        mine = zeros_;
      }
      parallel_.pipeline->all_reduce(mine, n, DeviceElement::kF32, stream());
      if (mine == zeros_) cuda::check_cuda(cudaMemsetAsync(zeros_, 0, n * sizeof(float), s), "tied-embedding zeros");
    }
    complete();
  }
  // Expert parallelism: the host groups, as the CPU's model gives them (ParamRef::expert_parallel; trainer.h).
  Communicator* expert_data_parallel() override { return experts_split() ? parallel_.host->expert_data.get() : nullptr; }
  Communicator* expert_parallel() override { return experts_split() ? parallel_.host->expert.get() : nullptr; }
  bool reports() const override {
    return !parallel_.host || (parallel_.host->coords.tensor == 0 && parallel_.host->coords.pipeline == 0);
  }
  void sum_over_model(std::span<double> values) override {
    if (!parallel_.host) return;
    if (parallel_.host->config.tensor > 1) parallel_.host->tensor->all_reduce(values);
    if (parallel_.host->config.pipeline > 1) parallel_.host->pipeline->all_reduce(values);
  }

  // cudaMemGetInfo counts every context on the device; the model's own buffers are allocated once, so their sum is
  // also the peak.
  std::optional<MemoryReport> device_memory() override {
    std::size_t free = 0, total = 0;
    cuda::check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    double allocated = 0;
    for (const auto& c : chunks_) allocated += static_cast<double>(c->device_bytes());
    return MemoryReport{static_cast<double>(total - free), allocated, allocated};
  }

  double grad_norm() override {
    double sumsq = 0;
    for (auto& c : chunks_) sumsq += c->grad_sumsq();
    if (parallel_.host) {
      sum_over_model(std::span<double>(&sumsq, 1));
      if (sharded()) parallel_.host->data->all_reduce(std::span<double>(&sumsq, 1));  // the ranges' sums
      // Expert parallelism: a rank counts its experts, and expert rank 0 the rest (rank_shards' `saved`).
      if (experts_split()) parallel_.host->expert->all_reduce(std::span<double>(&sumsq, 1));
    }
    if (parallel_.host || chunks_.size() > 1)
      for (auto& c : chunks_) c->set_grad_sumsq(sumsq);
    return std::sqrt(sumsq);
  }
  // The chunks' counts summed as grad_norm() sums their squares (doubles: exact below 2^53).
  std::int64_t grad_zeros() override {
    double zeros = 0;
    for (auto& c : chunks_) zeros += static_cast<double>(c->grad_zeros());
    if (parallel_.host) {
      sum_over_model(std::span<double>(&zeros, 1));
      if (sharded()) parallel_.host->data->all_reduce(std::span<double>(&zeros, 1));
      if (experts_split()) parallel_.host->expert->all_reduce(std::span<double>(&zeros, 1));
    }
    return static_cast<std::int64_t>(zeros);
  }
  void step(const AdamWOptions& options, double lr, double max_norm) override {
    options_ = options;
    for (auto& c : chunks_) c->apply_adamw(options, lr, max_norm);
    if (sharded()) {
      // Every rank's updated bf16 range (and norm weights) to every rank. Completed here, not at the next
      // forward: the host must never synchronize a stream that holds collectives (a lost peer would hang it).
      for (auto& c : chunks_) c->share_updated_weights(*parallel_.data);
      complete();
    }
  }
  int optimizer_shards() const override { return first().shard().optimizer_shards; }
  bool reduces_gradients() const override { return sharded() || !reducers_.empty() || experts_split(); }
  std::size_t buckets_reduced_in_backward() const override {
    std::size_t n = 0;
    for (const auto& r : reducers_) n += static_cast<std::size_t>(r->buckets_in_backward());
    return n;
  }
  AdamW optimizer_state() override {
    AdamW state(options_);
    state.set_steps(first().optimizer_steps());
    // As the host AdamW: no moments before the first step.
    if (first().optimizer_steps() > 0)
      for (auto& c : chunks_) {
        std::vector<std::vector<float>> m, v;
        c->export_moments(m, v);
        for (std::size_t k = 0; k < m.size(); ++k) {
          state.exp_avg().push_back(std::move(m[k]));
          state.exp_avg_sq().push_back(std::move(v[k]));
          sum_shards(state.exp_avg().back());
          sum_shards(state.exp_avg_sq().back());
        }
      }
    return state;
  }
  std::int64_t optimizer_steps() const override { return first().optimizer_steps(); }
  // The chunks' StateCopy (state_copy.h); with optimizer shards none (whole tensors need sum_shards).
  std::unique_ptr<DeviceSnapshot> begin_snapshot() override {
    if (sharded()) return nullptr;
    const bool moments = first().optimizer_steps() > 0;
    for (auto& c : chunks_) c->begin_state_copy(moments);
    return std::make_unique<Snapshot>(chunks_, moments);
  }
  void reserve_snapshot() override {
    if (!sharded())
      for (auto& c : chunks_) c->reserve_state_copy();
  }
  void load_optimizer_state(const AdamW& state) override {
    options_ = state.options();
    if (!state.exp_avg().empty()) {
      const std::size_t count = tensor_count();
      if (state.exp_avg().size() != count || state.exp_avg_sq().size() != count)
        fail(fmt::format("optimizer state: {} moment tensors for {} parameters", state.exp_avg().size(), count));
      std::size_t k = 0;
      for (auto& c : chunks_)
        for (const auto& s : c->tensors()) {
          c->import_moments(s.name, state.exp_avg()[k], state.exp_avg_sq()[k]);
          ++k;
        }
    }
    for (auto& c : chunks_) c->set_optimizer_steps(state.steps());
  }
  void commit_parameters() override {
    if (host_.size() != tensor_count()) fail("commit_parameters: no host copies (call parameters() first)");
    std::size_t k = 0;
    for (auto& c : chunks_)
      for (const auto& s : c->tensors()) c->import_parameter(s.name, host_[k++]);
    host_.clear();
    host_.shrink_to_fit();
    for (auto& c : chunks_) c->release_host_buffers();  // a load's: saves allocate them again
  }
  std::vector<DeviceSpan> gradient_buffers() override { return per_chunk(&CudaModel::gradient_buffer); }
  std::vector<DeviceSpan> parameter_buffers() override { return per_chunk(&CudaModel::parameter_buffer); }
  void* stream() override { return first().stream(); }
  void parameters_written() override {
    for (auto& c : chunks_) c->master_weights_written();
  }
  std::vector<float> gradient(std::string_view name) override {
    for (auto& c : chunks_)
      for (const auto& s : c->tensors())
        if (s.name == name) return c->export_gradient(name);
    fail(fmt::format("no local parameter '{}'", name));
  }

 private:
  class Snapshot final : public DeviceSnapshot {
   public:
    Snapshot(const std::vector<std::unique_ptr<CudaModel>>& chunks, bool moments)
        : chunks_(chunks), moments_(moments) {}
    void finish(std::vector<ParamRef>& params, std::vector<std::span<const float>>& exp_avg,
                std::vector<std::span<const float>>& exp_avg_sq) override {
      for (const auto& c : chunks_) {
        c->finish_state_copy();
        const auto& specs = c->tensors();
        for (std::size_t i = 0; i < specs.size(); ++i) {
          const int p = static_cast<int>(i);
          const std::span<const float> values = c->copied_parameter(p);
          // The writer only reads them (ParamRef's value is mutable for the optimizers' sake).
          params.push_back({specs[i].name, {const_cast<float*>(values.data()), values.size()}, {},
                            !specs[i].is_norm, specs[i].global_shape, specs[i].saved});
          if (!moments_) continue;
          exp_avg.push_back(c->copied_exp_avg(p));
          exp_avg_sq.push_back(c->copied_exp_avg_sq(p));
        }
      }
    }

   private:
    const std::vector<std::unique_ptr<CudaModel>>& chunks_;
    bool moments_;
  };

  CudaModel& first() const { return *chunks_.front(); }
  std::vector<DeviceSpan> per_chunk(CudaModel::Span (CudaModel::*buffer)() const) const {
    std::vector<DeviceSpan> out;
    for (const auto& c : chunks_) {
      const CudaModel::Span s = (*c.*buffer)();
      out.push_back({s.name, s.data, s.numel});
    }
    return out;
  }
  std::size_t tensor_count() const {
    std::size_t n = 0;
    for (const auto& c : chunks_) n += c->tensors().size();
    return n;
  }
  bool model_parallel() const {
    return parallel_.host && (parallel_.host->config.tensor > 1 || parallel_.host->config.pipeline > 1);
  }
  bool sharded() const { return first().shard().optimizer_shards > 1; }
  bool experts_split() const { return first().shard().layout.ep > 1; }
  static bool is_expert(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }
  // Expert parallelism: the experts' gradients summed over the expert-data-parallel group, every other tensor's over
  // the data-parallel group. Each run of neighbouring tensors of one kind goes as one span of the flat buffer (the
  // gaps between tensors hold zeros, which sum to zeros).
  void reduce_over_data_groups() {
    const int edp = parallel_.host->config.expert_data();
    for (auto& c : chunks_) {
      const auto& specs = c->tensors();
      const auto grads = c->gradient_buffers();
      for (std::size_t i = 0; i < specs.size();) {
        const bool expert = is_expert(specs[i].name);
        std::size_t end = i + 1;
        while (end < specs.size() && is_expert(specs[end].name) == expert) ++end;
        const auto count = static_cast<std::size_t>(grads[end - 1].data + grads[end - 1].numel - grads[i].data);
        if (!expert) parallel_.data->all_reduce(grads[i].data, count, DeviceElement::kF32, stream());
        else if (edp > 1) parallel_.expert_data->all_reduce(grads[i].data, count, DeviceElement::kF32, stream());
        i = end;
      }
    }
  }
  // A tensor each optimizer shard exported as its range and zeros elsewhere becomes the whole tensor on every
  // rank (summed over the data-parallel group: x + 0 = x exactly).
  void sum_shards(std::vector<float>& values) {
    if (sharded()) parallel_.host->data->all_reduce(std::span<float>(values));
  }
  // Chunk v of `chunks` on this rank (the whole model without groups); `stream` shared when given.
  static CudaShard shard_of(const ckpt::ModelConfig& config, const CudaParallelGroups& p, int v, int chunks,
                            void* stream) {
    if (!p.host) return {};
    const ParallelConfig& c = p.host->config;
    if ((c.tensor > 1 && !p.tensor) || (c.pipeline > 1 && !p.pipeline))
      fail("GPU model parallelism needs the tensor and pipeline groups over device memory");
    const bool distributed = p.distributed_optimizer && c.data > 1;
    if (distributed && (!p.data || p.data->size() != c.data || p.data->rank() != p.host->coords.data))
      fail("the distributed optimizer on the GPU needs the data-parallel group over device memory");
    CudaShard shard;
    if (distributed) shard.optimizer_shards = c.data, shard.optimizer_rank = p.host->coords.data;
    shard.layout = ckpt::ParallelLayout{c.tensor, c.pipeline * chunks, c.data, {}};
    if (c.expert > 1) {
      // The experts' optimizer state would be sharded over the expert-data-parallel group (as the CPU's sharded
      // step does), the overlapped reduction split into two buffers: neither is wired on the GPU.
      if (distributed || p.overlap_grad_reduce)
        fail("--expert-model-parallel-size on the GPU: not with --use-distributed-optimizer or --overlap-grad-reduce yet");
      if (!p.expert || !p.data || (c.expert_data() > 1 && !p.expert_data))
        fail("GPU expert parallelism needs the expert-parallel, data-parallel and expert-data-parallel groups over "
             "device memory");
      shard.layout.ep = c.expert;
      shard.expert_rank = expert_rank(c, p.host->coords);
      shard.expert = p.expert;
    }
    shard.layout.validate(config);
    shard.tensor_rank = p.host->coords.tensor;
    shard.stage = v * c.pipeline + p.host->coords.pipeline;
    shard.sequence_parallel = p.sequence_parallel;
    shard.tensor = c.tensor > 1 ? p.tensor : nullptr;
    shard.stream = stream;
    return shard;
  }
  std::size_t embedding_rows() const {
    const auto& c = first().config();
    return static_cast<std::size_t>(c.padded_vocab_size() / first().shard().layout.tp * c.hidden_size);
  }
  // Every transfer of the step has completed (a lost rank is named here, within the timeout).
  // The data group's buckets are left running at the end of a step's micro-batches (finish_gradients()
  // completes them).
  void complete(bool data_too = true) {
    if (parallel_.tensor) parallel_.tensor->complete();
    if (parallel_.pipeline) parallel_.pipeline->complete();
    if (experts_split()) parallel_.expert->complete();
    if (data_too && reduces_gradients()) parallel_.data->complete();
    if (data_too && experts_split() && parallel_.expert_data) parallel_.expert_data->complete();
  }
  double run(std::span<const ModelBatch> batches, bool training) {
    // The buckets are reduced once per step, in its last backward: gradients added after that would miss the sum.
    const bool overlap = training && !reducers_.empty() && !batches.empty();
    if (overlap && reduced_) fail("--overlap-grad-reduce: one forward_backward_all per step (after zero_grad)");
    if (overlap) reduced_ = true;
    if (!model_parallel()) {
      CudaModel& m = first();
      double loss = 0;
      for (std::size_t k = 0; k < batches.size(); ++k) {
        if (overlap && k + 1 == batches.size()) reducers_.front()->start();
        loss += training ? m.forward_backward(cuda_batch(batches[k])) : m.forward_loss(cuda_batch(batches[k]));
      }
      return loss;
    }
    // One schedule runs micro-batches of one shape; MegaDLMs' variable-length draw (--difflm-varilen-prob) cuts a
    // micro-batch's sequence, so a step may hold several shapes. Each run of one shape goes through the schedule in
    // turn: the gradients add up to the same sum, and the buckets are reduced in the last run's last backward.
    double loss = 0;
    for (std::size_t begin = 0; begin < batches.size();) {
      std::size_t end = begin + 1;
      while (end < batches.size() && batches[end].batch == batches[begin].batch &&
             batches[end].seq == batches[begin].seq)
        ++end;
      loss += run_schedule(batches.subspan(begin, end - begin), training, overlap && end == batches.size());
      begin = end;
    }
    return loss;
  }
  // Micro-batches of one shape through the pipeline schedule (1F1B, or interleaved over the chunks).
  double run_schedule(std::span<const ModelBatch> batches, bool training, bool reduce) {
    const int stages = parallel_.host->config.pipeline;
    // The interleaved schedule takes a multiple of the pipeline's size: a shorter run is filled up with copies of
    // its first micro-batch whose loss weights are zero, which add nothing to the loss or the gradients.
    std::vector<ModelBatch> filled;
    if (chunks_.size() > 1 && batches.size() % static_cast<std::size_t>(stages) != 0) {
      filled.assign(batches.begin(), batches.end());
      while (filled.size() % static_cast<std::size_t>(stages) != 0) {
        filled.push_back(batches.front());
        std::fill(filled.back().weights.begin(), filled.back().weights.end(), 0.0f);
      }
      batches = filled;
    }
    const int M = static_cast<int>(batches.size());
    std::vector<CudaStage> stage_views;
    std::vector<PipelineStage*> views;
    stage_views.reserve(chunks_.size());
    for (std::size_t v = 0; v < chunks_.size(); ++v) {
      CudaModel& c = *chunks_[v];
      for (int k = 0; k < M; ++k) c.upload_inputs(k, cuda_batch(batches[static_cast<std::size_t>(k)]));
      views.push_back(&stage_views.emplace_back(c, reduce ? reducers_[v].get() : nullptr, M));
    }
    if (chunks_.size() == 1) {
      first().reserve_slots(training ? std::min(stages - parallel_.host->coords.pipeline, M) : 1);
      run_pipeline_1f1b(stage_views.front(), parallel_.pipeline, M, training);
    } else {
      run_pipeline_interleaved(views, parallel_.pipeline, M, training);  // slots on demand
    }
    complete(false);
    double loss = 0;  // the last stage's; every other stage's is 0
    for (auto& c : chunks_) loss += c->take_loss();
    if (stages > 1) parallel_.host->pipeline->all_reduce(std::span<double>(&loss, 1));
    return loss;
  }

  CudaParallelGroups parallel_;
  std::vector<std::unique_ptr<CudaModel>> chunks_;
  // --overlap-grad-reduce, one per chunk (after chunks_: destroyed first, they clear the models' hooks).
  std::vector<std::unique_ptr<CudaGradReducer>> reducers_;
  bool reduced_ = false;  // this step's buckets were started (by its backward or finish_gradients())
  std::vector<std::vector<float>> host_;  // parameters()' copies, chunk by chunk
  AdamWOptions options_;
  float* zeros_ = nullptr;
};

}  // namespace

std::unique_ptr<TrainableModel> make_cuda_trainable(const ckpt::ModelConfig& config, std::uint64_t seed,
                                                    const CudaParallelGroups& parallel, const CudaOptions& options) {
  return std::make_unique<CudaTrainable>(config, seed, parallel, options);
}

}  // namespace dlm::train
