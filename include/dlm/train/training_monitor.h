// What the trainer reports and where, as Megatron-LM reports it (megatron/training/training.py, training_log and
// evaluate_and_print_results, at Megatron-LM d98e8a64), so that Megatron users' dashboards and log parsers work:
//   - the text log (megatron_log.h) on stderr beside dlm's other log lines (Megatron prints it on stdout): the
//     iteration line every --log-interval iterations, after the job's first iteration (without closing the
//     interval, as Megatron) and after the last; the validation block;
//   - TensorBoard scalars under Megatron's tags, every --tensorboard-log-interval iterations, each also "<tag> vs
//     samples" with the consumed samples as its step: learning-rate, batch-size, lm loss (the iteration's),
//     loss-scale (1.0), grad-norm, num-zeros (--log-num-zeros-in-grad), params-norm (--log-params-norm),
//     mem-reserved-bytes / mem-allocated-bytes / mem-max-allocated-bytes (--log-memory-to-tensorboard: the GPU's
//     or the host's, MemoryReport); at each log line iteration-time (s, --log-timers-to-tensorboard) and throughput (TFLOP/s/GPU,
//     with --log-throughput too); at validation "lm loss validation" (+ " ppl" with
//     --log-validation-ppl-to-tensorboard);
//   - the JSONL metrics file (dlm's own keys) at each log line that closes an interval, and after validation;
//   - progress.txt (progress_log.h) with --log-progress.
// One replica reports (the losses and norms are the group's on every rank); the norms it is given are computed by
// every rank, at the iterations wants_norms() names.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dlm/train/moe_metrics.h"

namespace dlm::train {

class TensorBoardWriter;
class JsonlMetrics;
class ProgressLog;
struct TrainerOptions;

struct MonitorOptions {
  bool log_throughput = false;                     // --log-throughput: TFLOP/s per GPU in the log line
  bool log_params_norm = false;                    // --log-params-norm
  bool log_num_zeros_in_grad = false;              // --log-num-zeros-in-grad
  bool log_timers_to_tensorboard = false;          // --log-timers-to-tensorboard: iteration-time, throughput
  bool log_memory_to_tensorboard = false;          // --log-memory-to-tensorboard: the GPU's (or host) memory
  bool log_validation_ppl_to_tensorboard = false;  // --log-validation-ppl-to-tensorboard
  std::int64_t tensorboard_log_interval = 1;       // --tensorboard-log-interval
  std::int64_t tensorboard_queue_size = 1000;      // --tensorboard-queue-size: events held before a write
  std::string progress_dir;                        // --log-progress: the --save folder ("" = no progress.txt)
  std::string job_id;                              // progress.txt's "Job ID" (Megatron: SLURM_JOB_ID)
  int world_size = 1;                              // ranks of the job: throughput is per GPU
  double flops_per_iteration = 0;                  // flops.h; 0 = unknown (no throughput)
};

// Memory under Megatron's three tags (mem-reserved-bytes, mem-allocated-bytes, mem-max-allocated-bytes; they name
// torch.cuda.memory_stats() counters there). On the GPU backend: the device's memory in use by every process and
// context (cudaMemGetInfo: total - free), the bytes the model allocated, and the same again as the peak (dlm
// allocates its device memory once, at start-up). On the host (host_memory.h): resident set, bytes in use by
// malloc, peak resident set.
struct MemoryReport {
  double reserved_bytes = 0, allocated_bytes = 0, max_allocated_bytes = 0;
};

// One iteration as the trainer saw it.
struct IterationReport {
  std::int64_t iteration = 0, consumed_samples = 0;
  double loss = 0, grad_norm = 0, seconds = 0;
  double lr = 0;            // the rate this iteration's update used (the JSONL file's "lr")
  double megatron_lr = 0;   // the rate after the scheduler's step, lr(iteration): what Megatron logs as "learning rate"
  bool skipped = false;
  std::optional<double> params_norm;
  std::optional<std::int64_t> num_zeros;
  std::optional<MemoryReport> memory;  // where wants_memory()
  std::optional<MoeMetrics> moe;       // a mixture-of-experts model
};

// Which evaluation a validation() call reports: the periodic one, or the validation and test splits once more at
// the end of training (Megatron's "... on validation set" / "... on test set" lines).
enum class EvaluatedSet { kPeriodic, kValidation, kTest };

class TrainingMonitor {
 public:
  // Reads options.monitor, the intervals, the batch and the output paths. `reporting`: this rank writes (the others
  // only count); `start_iteration`: the iteration the job resumes after.
  TrainingMonitor(const TrainerOptions& options, bool reporting, std::int64_t start_iteration);
  ~TrainingMonitor();

  // Whether iteration `iteration` needs the parameters' norm or the gradient's zeros (the same on every rank):
  // at log lines and TensorBoard iterations; at log lines only when `costly` (a model on the GPU, whose weights
  // are copied to the host to be measured).
  bool wants_norms(std::int64_t iteration, bool costly) const;
  // Whether this rank writes memory scalars at `iteration` (--log-memory-to-tensorboard).
  bool wants_memory(std::int64_t iteration) const;
  void iteration(const IterationReport& r);
  void validation(std::int64_t iteration, std::int64_t consumed_samples, double loss,
                  EvaluatedSet set = EvaluatedSet::kPeriodic);
  // After a checkpoint of `iteration` was committed.
  void saved(std::int64_t iteration, std::int64_t consumed_samples);

 private:
  bool log_line_due(std::int64_t iteration) const;
  void write_log_line(const IterationReport& r, bool closes_interval);
  MonitorOptions options_;
  std::int64_t train_iters_, global_batch_size_, seq_length_, log_interval_, first_iteration_;
  bool reporting_;
  bool tensorboard_;
  std::unique_ptr<TensorBoardWriter> tb_;
  std::unique_ptr<JsonlMetrics> jsonl_;
  std::unique_ptr<ProgressLog> progress_;
  // The interval since the last line that closed one.
  double seconds_ = 0, loss_sum_ = 0, applied_loss_sum_ = 0;
  std::int64_t count_ = 0, applied_ = 0, skipped_ = 0, nan_ = 0;
  std::vector<std::pair<std::string, double>> moe_loss_sums_;  // the MoE losses summed over the applied iterations
};

}  // namespace dlm::train
