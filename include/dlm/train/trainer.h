// Trainer: Megatron's training loop for one model replica — micro-batches accumulated into a global
// batch, AdamW with global-norm clipping, the LR schedule, validation every N iterations, a log line /
// JSONL / TensorBoard per log interval, periodic and on-signal checkpoints, and a resume that
// continues the same run; with a data-parallel group, one replica of DP.
//
// Data order (batch_plan.h): iteration i, micro-batch m, row b reads global sample i*G + m*M + b (G global batch,
// M micro batch) of the sample source; the objective's noise is keyed by that index and the LR by i,
// so a resumed run needs nothing but the iteration, the weights and the optimizer's moments to draw
// the very same numbers (docs/training.md). Under data parallelism (size DP, rank d) the global
// micro-batches m = k*DP + d, k = 0 .. G/(M*DP) - 1, are rank d's (Megatron's sampler: each rank takes
// its M rows of every M*DP), each weighted by 1/(G/M) as on one process; the gradients are summed over
// the group, so any DP gives the single-process run up to the order of fp32 sums (docs/parallelism.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlm/train/batch_plan.h"
#include "dlm/train/communicator.h"
#include "dlm/train/lr_schedule.h"
#include "dlm/train/moe_metrics.h"
#include "dlm/train/objective.h"
#include "dlm/train/optimizer.h"
#include "dlm/train/training_monitor.h"

namespace dlm::train {

// fp32 values in device memory, for collectives that take device pointers (NCCL).
struct DeviceSpan {
  std::string name;  // the parameter's, or "" for a whole buffer
  float* data = nullptr;
  std::int64_t numel = 0;
};

// A checkpoint's state on its way from the device to host memory (DeviceTraining::begin_snapshot).
class DeviceSnapshot {
 public:
  virtual ~DeviceSnapshot() = default;
  // Blocks until the copies have landed (any thread; once), then gives the parameters as parameters() would (names,
  // global shapes; no gradients), their values and the moments (in the same order; none before AdamW's first step)
  // in host memory the model keeps until its next begin_snapshot().
  virtual void finish(std::vector<ParamRef>& params, std::vector<std::span<const float>>& exp_avg,
                      std::vector<std::span<const float>>& exp_avg_sq) = 0;
};

// A model whose weights, gradients and AdamW state live on an accelerator (the CUDA backend): the trainer
// leaves clipping and the update to it, and moves the moments through it for checkpoints, so that only
// the norm and the loss cross to the host each step. Its parameters() are then host copies of the fp32
// master weights made on each call (grad spans empty); commit_parameters() loads edited copies back.
class DeviceTraining {
 public:
  virtual ~DeviceTraining() = default;
  // The global L2 norm of the gradients (before clipping); computed on the device.
  virtual double grad_norm() = 0;
  // --log-num-zeros-in-grad: the exact zeros of the gradients the norm counts, over the whole model (collective
  // like grad_norm(): summed over the model's ranks and, sharded, the data-parallel group); counted on the device.
  virtual std::int64_t grad_zeros() = 0;
  // Megatron's clipping at max_norm (<= 0: none) by the last grad_norm(), then one AdamW step at lr.
  virtual void step(const AdamWOptions& options, double lr, double max_norm) = 0;
  // The moments per parameter (model order) and the step count, as the host AdamW holds them.
  virtual AdamW optimizer_state() = 0;
  virtual void load_optimizer_state(const AdamW& state) = 0;
  // The AdamW steps taken (optimizer_state().steps(), without the moments).
  virtual std::int64_t optimizer_steps() const = 0;
  // The checkpoint's state (master weights and moments) as it stands now, copied to host memory while training
  // goes on: the call enqueues the copies and returns; the device orders its next write of that state (the next
  // AdamW step) after them. Null where the model cannot (the distributed optimizer: whole tensors need a
  // collective); the saver then uses parameters() and optimizer_state(). reserve_snapshot() allocates the host
  // memory at once (a run that will snapshot calls it at start-up, so its first save point does not pay for it).
  virtual std::unique_ptr<DeviceSnapshot> begin_snapshot() { return nullptr; }
  virtual void reserve_snapshot() {}
  // After the host copies of parameters() were written (a checkpoint's weights): upload them.
  virtual void commit_parameters() = 0;
  // Device views for data parallelism: the fp32 gradients and the master weights' bytes (4 a parameter, to copy
  // bitwise: CudaModel::parameter_buffer()), one contiguous buffer each per model chunk (one chunk but with
  // interleaved pipelines; alignment gaps hold zeros), the stream the model's work runs on (a cudaStream_t),
  // and the call to make after the master weights were written in place (a broadcast): it refreshes the
  // copies made from them. With optimizer shards there is no master weights' buffer and parameters_written()
  // fails (no rank holds the others' ranges to broadcast; parameters() gathers them for checkpoints).
  virtual std::vector<DeviceSpan> gradient_buffers() = 0;
  virtual std::vector<DeviceSpan> parameter_buffers() = 0;
  virtual void* stream() = 0;
  virtual void parameters_written() = 0;
  // The distributed optimizer's data-parallel ranks (1: none): each holds its range of the optimizer state.
  virtual int optimizer_shards() const = 0;
  // Whether finish_gradients() has summed the gradients over the data-parallel group itself, so the trainer
  // must not: the distributed optimizer's reduce-scatter of each rank's range, or --overlap-grad-reduce on the
  // GPU (buckets all-reduced during the last backward, the rest in finish_gradients()).
  virtual bool reduces_gradients() const { return false; }
  // Of the last step's gradient buckets, those whose reduction started inside the backward.
  virtual std::size_t buckets_reduced_in_backward() const { return 0; }
  // A host copy of one local parameter's gradient as it stands (tests compare layouts by it).
  virtual std::vector<float> gradient(std::string_view name) = 0;
  // With CudaOptions::profile: the time of each phase of the steps so far, a table for a person to read
  // (CudaModel::profile_report); "" without profiling.
  virtual std::string profile_report() { return {}; }
  // --log-memory-to-tensorboard: the GPU's memory (empty where not known: the host's is reported instead).
  virtual std::optional<MemoryReport> device_memory() { return std::nullopt; }
};

// What the trainer needs of a model; the model behind it (and its backend) stays out of sight.
class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  // Host views of every parameter and its gradient, in a fixed order (the model's tensor order).
  virtual std::vector<ParamRef> parameters() = 0;
  virtual void zero_grad() = 0;
  // sum_i w_i CE_i over the batch; adds its gradient into the parameters' gradients.
  virtual double forward_backward(const ModelBatch& batch) = 0;
  // The same loss, no gradient.
  virtual double forward_loss(const ModelBatch& batch) = 0;
  // Non-null when the optimizer runs beside the weights on a device (see DeviceTraining).
  virtual DeviceTraining* device_training() { return nullptr; }

  // A step's micro-batches (this data-parallel rank's share, in order) in one call: the sum of their
  // losses. A pipeline runs them through its schedule; by default they run one after the other.
  virtual double forward_backward_all(std::span<const ModelBatch> batches) {
    double loss = 0;
    for (const auto& b : batches) loss += forward_backward(b);
    return loss;
  }
  virtual double forward_loss_all(std::span<const ModelBatch> batches) {
    double loss = 0;
    for (const auto& b : batches) loss += forward_loss(b);
    return loss;
  }
  // Model parallelism (model_parallel.h): after a step's last backward, completes the gradients several
  // ranks of the replica share (replicated norms, the tied embedding of the first and last stage).
  virtual void finish_gradients() {}
  // Sums `values` over the other ranks of this model replica (tensor and pipeline groups): how a
  // rank's share of the squared gradient norm becomes the whole model's. Nothing on one process.
  virtual void sum_over_model(std::span<double> /*values*/) {}
  // Expert parallelism (model.h; null without): the groups that take the data-parallel group's place for the
  // ParamRef::expert_parallel tensors: their gradients are summed over the expert-data-parallel group, and each
  // rank's squared norm of them over the expert-parallel group (every member holds other experts).
  virtual Communicator* expert_data_parallel() { return nullptr; }
  virtual Communicator* expert_parallel() { return nullptr; }
  // A mixture-of-experts model: this rank's sums of the MoE metrics since the last call (moe_metrics.h); empty
  // (experts 0) for a dense model.
  virtual MoeStepSums take_moe_sums() { return {}; }
  // Whether this rank speaks for its replica (logs, metrics files): one rank of a model-parallel replica.
  virtual bool reports() const { return true; }
  // --overlap-grad-reduce: during the last micro-batch's backward of a step (and in finish_gradients()),
  // the model calls `hook` with a parameter's index into parameters() once its gradient is final. A model
  // that never calls it is still correct: its buckets are reduced after the backward.
  virtual void set_gradient_ready_hook(std::function<void(std::size_t)> /*hook*/) {}
};

// Samples of seq_length + 1 tokens by global index (libdata's GPTDataset/BlendedDataset reader).
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual std::uint64_t size() const = 0;
  virtual void read(std::uint64_t index, std::span<std::int32_t> tokens) const = 0;
};

// What a step whose loss or gradient norm is NaN/Inf does; the update is never applied either way.
//   kStop: save the last good state (the weights before the step) and stop with an error naming the iteration
//   kSkip: drop the step's gradients, count it, go on with the next iteration's data
enum class NonFinitePolicy { kStop, kSkip };
NonFinitePolicy parse_non_finite_policy(const std::string& name);  // "stop" | "skip"

struct TrainerOptions {
  std::int64_t train_iters = 0;        // --train-iters
  std::int64_t micro_batch_size = 1;   // --micro-batch-size
  std::int64_t global_batch_size = 1;  // --global-batch-size
  std::int64_t seq_length = 0;         // --seq-length
  double clip_grad = 1.0;              // --clip-grad
  std::int64_t log_interval = 1;       // --log-interval
  std::int64_t eval_interval = 0;      // --eval-interval (0: never)
  std::int64_t eval_iters = 1;         // --eval-iters
  bool full_validation = false;        // --full-validation: each evaluation is the whole validation split
  std::int64_t save_interval = 0;      // --save-interval (0: only at the end and on signals)
  std::optional<std::int32_t> eod_token;  // with eod_mask_loss: loss_mask 0 where the label is eod
  bool eod_mask_loss = false;          // --eod-mask-loss
  std::int64_t exit_interval = 0;      // --exit-interval: stop (after saving) at a multiple of it
  std::set<std::int64_t> checkpoint_steps;  // --checkpoint-steps: also save after these iterations
  std::int64_t non_persistent_save_interval = 0;  // --non-persistent-save-interval (0: none; run's save_non_persistent)
  AdamWOptions adam;
  LrScheduleOptions lr;
  ObjectiveOptions objective;
  std::string tensorboard_dir;         // --tensorboard-dir ("" = none)
  std::string metrics_path;            // --metrics-file ("" = none): JSONL
  MonitorOptions monitor;              // Megatron's log line, TensorBoard tags, progress.txt (training_monitor.h)
  NonFinitePolicy on_non_finite = NonFinitePolicy::kStop;  // --on-nan
  std::int64_t max_skipped_steps = 10; // --on-nan skip: stop once this many steps were skipped in a row
  bool use_distributed_optimizer = false;   // --use-distributed-optimizer: AdamW moments sharded over DP
  std::int64_t ddp_bucket_size = 40'000'000;  // --ddp-bucket-size: gradient elements per bucket
  bool overlap_grad_reduce = false;  // --overlap-grad-reduce: buckets reduced during the last backward
};

// What a checkpoint holds of the run besides the weights.
struct TrainProgress {
  std::int64_t iteration = 0;
  std::int64_t consumed_samples = 0;
};

// Saves the model, optimizer and progress (libckpt behind it; dlm-train's is a CheckpointSaver); called at the
// save points of checkpoint_saver.h's SaveSchedule, on every rank of the data-parallel group, with the whole
// (gathered) optimizer state on each; for a model with DeviceTraining, the optimizer's options and step count only:
// the saver takes the state from the device itself (DeviceTraining::begin_snapshot or optimizer_state).
using SaveFn = std::function<void(const TrainProgress& progress, TrainableModel& model, const AdamW& optimizer)>;

struct IterationStats {
  std::int64_t iteration = 0;
  bool skipped = false;  // non-finite loss or gradient norm, update dropped (--on-nan skip)
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_second = 0, seconds = 0;
};

class GradientStep;

class Trainer {
 public:
  // Checks every option before any compute (dlm::Error naming the flag). With `data_parallel` (which
  // must outlive the trainer) this is one replica of the group: the weights are broadcast from its
  // rank 0, and each rank reads only its own micro-batches. A model trained on a device (DeviceTraining)
  // also needs `device_data_parallel`, the same group over device memory (NCCL, on the model's stream):
  // it carries the weights' broadcast and the gradients' sum, `data_parallel` the host scalars.
  Trainer(TrainerOptions options, TrainableModel& model, const SampleSource& train, const SampleSource* valid,
          Communicator* data_parallel = nullptr, Communicator* device_data_parallel = nullptr);
  ~Trainer();

  // Resume from a checkpoint's progress and whole optimizer state (the weights are the model's
  // business); under the distributed optimizer each rank keeps its shard of the moments. The validation
  // position resumes as Megatron's does for a checkpoint without consumed_valid_samples: after
  // (iteration / eval_interval) evaluations of eval_iters batches each.
  void resume(const TrainProgress& progress, AdamW optimizer_state);
  // The same without the optimizer's state: its moments start afresh (--no-load-optim).
  void resume(const TrainProgress& progress);
  // The test split, evaluated once when training ends (Megatron's do_test); must outlive the trainer.
  void set_test_data(const SampleSource* test) { test_ = test; }
  // Runs until train_iters, exit_interval or `stop` (set by SIGINT/SIGTERM) and saves through `save` (null: never),
  // and through `save_non_persistent` at the non-persistent save points (checkpoint_saver.h's SaveSchedule).
  // When it reaches train_iters (not on an early stop, where Megatron exits), the validation split is evaluated
  // once more and the test split once, as Megatron ends pretrain(). Returns the stats of every iteration run.
  std::vector<IterationStats> run(const SaveFn& save, const std::atomic<bool>* stop = nullptr,
                                  const SaveFn& save_non_persistent = nullptr);

  // Megatron's evaluate(): the mean loss over the next eval_iters global batches of the validation source.
  // Its iterator is never reset, so each evaluation reads the batches after the previous one's; the split is
  // sized for every evaluation of the run (eval_iters x (train_iters / eval_interval + 1) global batches), and
  // running past its end is an error naming the sizes.
  // With full_validation (Megatron's --full-validation; eval_iters then does not matter) each evaluation reads
  // every sample of the source once, from its first: the mean over the samples of each one's loss. The samples
  // go in micro-batches of micro_batch_size rows (the last one short: padded with rows of weight 0, so that the
  // model keeps its shape), global micro-batch g on data-parallel rank g mod DP, a step's count of them a call
  // (the last call filled up with micro-batches of weight 0), each rank running its own count of calls (no
  // forward has a collective over the data-parallel group).
  double evaluate();
  // The mean loss over the first eval_iters global batches of the test source.
  double evaluate_test();
  // Global batches of the validation source read so far (Megatron's consumed_valid_samples / global batch).
  std::int64_t validation_batches_read() const { return valid_batches_; }
  const TrainProgress& progress() const { return progress_; }
  // --overlap-grad-reduce: of the last step's gradient buckets, those whose reduction started before the
  // backward pass ended (0 without overlap).
  std::size_t overlapped_buckets() const;
  // The whole optimizer state, moments per parameter in model order (collective over the data-parallel
  // group under the distributed optimizer, which gathers the shards).
  AdamW optimizer_state() const;

  // The micro-batch of rows [first, first + micro_batch_size) of a source, as Megatron's GPTDataset
  // gives it (tokens, labels, loss_mask).
  SampleBatch read_batch(const SampleSource& source, std::uint64_t first) const;

 private:
  // The step's loss; the update is applied only when the loss and the gradient norm are finite.
  double train_step(std::int64_t iteration, double lr, double& grad_norm, bool& applied);
  // The step's MoE metrics over every rank (collective over the data-parallel group and the model); none for a
  // dense model.
  std::optional<MoeMetrics> step_moe_metrics(std::int64_t micro_batches);
  std::optional<MoeMetrics> moe_;  // the last step's
  // --log-params-norm: the L2 norm of the weights over the whole model (collective over the model's ranks).
  double params_norm();
  // --log-memory-to-tensorboard: the GPU's memory where the model reports it, else the host's.
  MemoryReport memory_report();
  TrainerOptions options_;
  TrainableModel& model_;
  const SampleSource& train_;
  // The mean loss of `batches` global batches of `source` from batch `first` (noise keyed by `seed`).
  double evaluate_batches(const SampleSource& source, std::int64_t first, std::int64_t batches, std::uint64_t seed,
                          const char* what);
  // full_validation's evaluation: the mean loss of every sample of `source` (noise keyed by `seed`).
  double evaluate_whole(const SampleSource& source, std::uint64_t seed);
  // Megatron's do_valid: validation data, and eval_iters > 0 or full_validation.
  bool validates() const { return valid_ && (options_.eval_iters > 0 || options_.full_validation); }
  // Rows [first, first + rows) of a source as Megatron's GPTDataset gives them.
  SampleBatch read_rows(const SampleSource& source, std::uint64_t first, std::int64_t rows) const;
  const SampleSource* valid_;
  const SampleSource* test_ = nullptr;
  std::int64_t valid_batches_ = 0;
  Communicator* dp_;
  // The optimizer arrangement (host, sharded host, on the device), chosen once here: libtrain/trainer/gradient_step.h.
  std::unique_ptr<GradientStep> step_;
  LrSchedule schedule_;
  BatchPlan plan_;  // the micro-batches of a step and this rank's share of them
  int dp_rank_;
  TrainProgress progress_;
};

// The entropy (nats) of the unigram distribution of the labels of the first `samples` samples: the loss
// of a model that ignores its input, the baseline a trained model must beat.
double unigram_entropy(const SampleSource& source, std::int64_t seq_length, std::uint64_t samples);

}  // namespace dlm::train
