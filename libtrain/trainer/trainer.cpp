// The training loop (see include/dlm/train/trainer.h for the data order and resume contract).
#include "dlm/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "dlm/train/batch_plan.h"
#include "dlm/train/checkpoint_saver.h"
#include "dlm/train/host_memory.h"
#include "gradient_step.h"

namespace dlm::train {
namespace {

// Validation and test draw their masks from streams of their own, so that their samples never share noise with
// the training samples of the same index.
constexpr std::uint64_t kValidationSeedSalt = 0x9e3779b97f4a7c15ull;
constexpr std::uint64_t kTestSeedSalt = 0xbf58476d1ce4e5b9ull;

// Rows [batch, rows) of `b` made copies of its row 0 with weight 0: the model keeps one shape, the loss stays b's.
void pad_rows(ModelBatch& b, std::int64_t rows) {
  if (b.batch >= rows) return;
  const auto seq = static_cast<std::size_t>(b.seq), missing = static_cast<std::size_t>(rows - b.batch);
  const auto copy_row_0 = [&](auto& column) {
    if (column.empty()) return;
    const std::vector row(column.begin(), column.begin() + static_cast<std::ptrdiff_t>(seq));
    for (std::size_t r = 0; r < missing; ++r) column.insert(column.end(), row.begin(), row.end());
  };
  copy_row_0(b.input_ids);
  copy_row_0(b.labels);
  copy_row_0(b.position_ids);
  copy_row_0(b.masked);
  b.weights.resize(b.weights.size() + missing * seq, 0.0f);
  b.batch = rows;
}

void check_options(const TrainerOptions& o) {
  if (o.train_iters <= 0) fail(fmt::format("--train-iters: {} must be positive", o.train_iters));
  BatchPlan(o.global_batch_size, o.micro_batch_size);  // the batch sizes' own errors, in flag order
  if (o.seq_length < 2) fail(fmt::format("--seq-length: {} must be at least 2", o.seq_length));
  if (o.log_interval <= 0) fail(fmt::format("--log-interval: {} must be positive", o.log_interval));
  if (o.eval_interval < 0 || o.eval_iters < 0) fail("--eval-interval and --eval-iters must not be negative");
  if (o.clip_grad < 0) fail(fmt::format("--clip-grad: {} is negative", o.clip_grad));
  if (o.eod_mask_loss && !o.eod_token) fail("--eod-mask-loss needs a tokenizer with an eod token");
  if (o.objective.kind != ObjectiveKind::kAutoregressive && o.objective.mask_token < 0)
    fail("the diffusion objective needs --mask-token (or a tokenizer with <|mask_token|>)");
}

}  // namespace

Trainer::Trainer(TrainerOptions options, TrainableModel& model, const SampleSource& train, const SampleSource* valid,
                 Communicator* data_parallel, Communicator* device_data_parallel)
    : options_(std::move(options)), model_(model), train_(train), valid_(valid), dp_(data_parallel),
      schedule_((check_options(options_), options_.lr)),
      plan_(options_.global_batch_size, options_.micro_batch_size, dp_ ? dp_->size() : 1),
      dp_rank_(dp_ ? dp_->rank() : 0) {
  const auto needed = static_cast<std::uint64_t>(options_.train_iters * options_.global_batch_size);
  if (train.size() < needed)
    fail(fmt::format("the training data has {} samples; --train-iters {} x --global-batch-size {} needs {}",
                     train.size(), options_.train_iters, options_.global_batch_size, needed));
  // Megatron's do_valid: validation data and eval_iters > 0 (or --full-validation); else nothing is evaluated.
  if (valid_ && options_.full_validation) {
    if (valid_->size() == 0) fail("--full-validation: the validation split has no samples");
    if (dp_rank_ == 0 && model_.reports())
      log::info("--full-validation: each evaluation reads the whole validation split, {} samples", valid_->size());
  } else if (valid_ && options_.eval_iters > 0) {
    const auto eval_needed = static_cast<std::uint64_t>(options_.eval_iters * options_.global_batch_size);
    if (valid_->size() < eval_needed)
      fail(fmt::format("the validation data has {} samples; --eval-iters {} x --global-batch-size {} needs {}",
                       valid_->size(), options_.eval_iters, options_.global_batch_size, eval_needed));
  }
  step_ = make_gradient_step(options_, model_, dp_, device_data_parallel);
}

Trainer::~Trainer() = default;

std::size_t Trainer::overlapped_buckets() const { return step_->overlapped_buckets(); }

void Trainer::resume(const TrainProgress& progress, AdamW optimizer_state) {
  resume(progress);
  step_->load_optimizer_state(std::move(optimizer_state));
}

void Trainer::resume(const TrainProgress& progress) {
  progress_ = progress;
  valid_batches_ = options_.eval_interval > 0 ? progress.iteration / options_.eval_interval * options_.eval_iters : 0;
}

AdamW Trainer::optimizer_state() const {
  AdamW whole{options_.adam};
  step_->with_optimizer_state([&](const AdamW& state) { whole = state; });
  return whole;
}

SampleBatch Trainer::read_batch(const SampleSource& source, std::uint64_t first) const {
  return read_rows(source, first, options_.micro_batch_size);
}

SampleBatch Trainer::read_rows(const SampleSource& source, std::uint64_t first, std::int64_t b) const {
  const std::int64_t l = options_.seq_length;
  SampleBatch s;
  s.batch = b;
  s.seq = l;
  s.tokens.resize(static_cast<std::size_t>(b * l));
  s.labels.resize(s.tokens.size());
  s.loss_mask.assign(s.tokens.size(), 1.0f);
  std::vector<std::int32_t> sample(static_cast<std::size_t>(l + 1));
  for (std::int64_t r = 0; r < b; ++r) {
    const std::uint64_t index = first + static_cast<std::uint64_t>(r);
    source.read(index, sample);
    s.sample_index.push_back(index);
    std::copy_n(sample.begin(), l, s.tokens.begin() + r * l);
    std::copy_n(sample.begin() + 1, l, s.labels.begin() + r * l);
    if (options_.eod_mask_loss)
      for (std::int64_t j = 0; j < l; ++j)
        if (sample[static_cast<std::size_t>(j + 1)] == *options_.eod_token) s.loss_mask[static_cast<std::size_t>(r * l + j)] = 0;
  }
  return s;
}

NonFinitePolicy parse_non_finite_policy(const std::string& name) {
  if (name == "stop") return NonFinitePolicy::kStop;
  if (name == "skip") return NonFinitePolicy::kSkip;
  fail(fmt::format("--on-nan: '{}' is not stop or skip", name));
}

double Trainer::train_step(std::int64_t iteration, double lr, double& grad_norm, bool& applied) {
  const std::int64_t micro = plan_.micro_batches();
  model_.zero_grad();
  std::vector<ModelBatch> batches;
  for (std::int64_t k = 0; k < plan_.micro_batches_per_rank(); ++k) {
    const std::int64_t m = plan_.micro_batch(dp_rank_, k);
    ModelBatch batch =
        make_model_batch(options_.objective, read_batch(train_, plan_.first_sample(iteration, m)), {iteration, micro, m, true});
    // Megatron averages the micro-batches' losses: fold 1/micro into the weights.
    for (float& w : batch.weights) w /= static_cast<float>(micro);
    batch.router_loss_weight = 1.0 / static_cast<double>(micro);
    batches.push_back(std::move(batch));
  }
  step_->before_backward();
  model_.take_moe_sums();  // drops what evaluation forwards added
  double loss = model_.forward_backward_all(batches);
  model_.finish_gradients();
  moe_ = step_moe_metrics(micro);
  step_->after_backward();
  const StepResult result = step_->apply(loss, lr);
  grad_norm = result.grad_norm;
  applied = result.applied;
  return loss;
}

std::optional<MoeMetrics> Trainer::step_moe_metrics(std::int64_t micro_batches) {
  MoeStepSums sums = model_.take_moe_sums();
  if (sums.experts == 0) return std::nullopt;
  if (dp_ && dp_->size() > 1) dp_->all_reduce<double>(sums.values);
  model_.sum_over_model(sums.values);
  return moe_metrics(sums, micro_batches);
}

double Trainer::params_norm() {
  double sum_sq = 0;
  for (const auto& p : model_.parameters())
    if (p.in_grad_norm)
      for (float v : p.value) sum_sq += static_cast<double>(v) * v;
  model_.sum_over_model(std::span<double>(&sum_sq, 1));
  return std::sqrt(sum_sq);
}

MemoryReport Trainer::memory_report() {
  if (DeviceTraining* device = model_.device_training())
    if (auto m = device->device_memory()) return *m;
  const HostMemory h = host_memory();
  return {static_cast<double>(h.resident_bytes), static_cast<double>(h.malloc_bytes),
          static_cast<double>(h.peak_resident_bytes)};
}

double Trainer::evaluate_batches(const SampleSource& source, std::int64_t first, std::int64_t batches,
                                 std::uint64_t seed, const char* what) {
  const auto end = static_cast<std::uint64_t>((first + batches) * options_.global_batch_size);
  if (source.size() < end)
    fail(fmt::format("the {} data has {} samples; evaluating global batches {} to {} of {} needs {} (it is sized for "
                     "--eval-iters x (--train-iters / --eval-interval + 1) batches, as Megatron sizes it)",
                     what, source.size(), first, first + batches - 1, options_.global_batch_size, end));
  ObjectiveOptions objective = options_.objective;
  objective.seed ^= seed;
  const std::int64_t micro = plan_.micro_batches();
  double total = 0;
  for (std::int64_t i = first; i < first + batches; ++i) {
    std::vector<ModelBatch> micro_batches;
    for (std::int64_t k = 0; k < plan_.micro_batches_per_rank(); ++k) {
      const std::int64_t m = plan_.micro_batch(dp_rank_, k);
      micro_batches.push_back(make_model_batch(objective, read_batch(source, plan_.first_sample(i, m)), {i, micro, m, false}));
    }
    total += model_.forward_loss_all(micro_batches);
  }
  if (plan_.data_parallel() > 1) dp_->all_reduce(std::span<double>(&total, 1));
  return total / static_cast<double>(batches * micro);
}

double Trainer::evaluate_whole(const SampleSource& source, std::uint64_t seed) {
  const auto samples = static_cast<std::int64_t>(source.size());
  const std::int64_t rows = options_.micro_batch_size, micro = (samples + rows - 1) / rows;
  ObjectiveOptions objective = options_.objective;
  objective.seed ^= seed;
  double total = 0;
  std::vector<ModelBatch> batches;
  // As many micro-batches a call as a step has, the last call's filled up with weight-0 copies: a pipeline's
  // schedule (the interleaved one takes no other count) and memory as in training.
  const auto run = [&] {
    if (batches.empty()) return;
    while (static_cast<std::int64_t>(batches.size()) < plan_.micro_batches_per_rank()) {
      batches.push_back(batches.front());
      std::fill(batches.back().weights.begin(), batches.back().weights.end(), 0.0f);
    }
    total += model_.forward_loss_all(batches);
    batches.clear();
  };
  for (std::int64_t g = dp_rank_; g < micro; g += plan_.data_parallel()) {
    const std::int64_t first = g * rows, n = std::min(rows, samples - first);
    ModelBatch batch = make_model_batch(objective, read_rows(source, static_cast<std::uint64_t>(first), n),
                                        {g, micro, g, false});
    // The micro-batch's loss is the mean over its rows: weighted by them, the sum over micro-batches is the
    // sum over samples.
    for (float& w : batch.weights) w *= static_cast<float>(n);
    pad_rows(batch, rows);
    batches.push_back(std::move(batch));
    if (static_cast<std::int64_t>(batches.size()) == plan_.micro_batches_per_rank()) run();
  }
  run();
  if (plan_.data_parallel() > 1) dp_->all_reduce(std::span<double>(&total, 1));
  return total / static_cast<double>(samples);
}

double Trainer::evaluate() {
  if (!validates()) return std::nan("");
  if (options_.full_validation) return evaluate_whole(*valid_, kValidationSeedSalt);
  const double loss = evaluate_batches(*valid_, valid_batches_, options_.eval_iters, kValidationSeedSalt, "validation");
  valid_batches_ += options_.eval_iters;
  return loss;
}

double Trainer::evaluate_test() {
  if (!test_ || options_.eval_iters <= 0) return std::nan("");
  return evaluate_batches(*test_, 0, options_.eval_iters, kTestSeedSalt, "test");
}

std::vector<IterationStats> Trainer::run(const SaveFn& save, const std::atomic<bool>* stop,
                                         const SaveFn& save_non_persistent) {
  // One replica reports: the losses and norms are the group's on every rank.
  const bool reporting = (!dp_ || dp_->rank() == 0) && model_.reports();
  TrainingMonitor monitor(options_, reporting, progress_.iteration);
  // When to save: checkpoint_saver.h.
  SaveSchedule schedule(options_.save_interval, options_.train_iters, options_.checkpoint_steps,
                        save_non_persistent ? options_.non_persistent_save_interval : 0);
  // A save point's pause in training (with --async-save, the snapshot only), in the log: the number to hold against
  // the step time.
  const auto save_through = [&](const SaveFn& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    step_->with_checkpoint_state([&](const AdamW& state) { fn(progress_, model_, state); });
    if (reporting)
      log::info("iteration {}: the checkpoint held training {:.2f} s", progress_.iteration,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  const auto save_now = [&] {
    if (!save) return;
    save_through(save);
    schedule.saved(progress_.iteration);
    monitor.saved(progress_.iteration, progress_.consumed_samples);
  };
  std::vector<IterationStats> stats;
  const double tokens_per_iteration = static_cast<double>(options_.global_batch_size * options_.seq_length);
  std::int64_t skipped_in_a_row = 0;
  const bool do_valid = validates();
  bool stopped_early = false;
  while (progress_.iteration < options_.train_iters) {
    const std::int64_t i = progress_.iteration;
    // Megatron steps its scheduler after the update: the update of iteration i + 1 uses lr(i).
    const double lr = schedule_.at(i);
    const auto t0 = std::chrono::steady_clock::now();
    IterationStats s;
    bool applied = true;
    s.loss = train_step(i, lr, s.grad_norm, applied);
    if (!applied) {
      const std::string what = fmt::format("iteration {}: loss {} / grad norm {} is not finite", i + 1, s.loss, s.grad_norm);
      if (options_.on_non_finite == NonFinitePolicy::kStop || ++skipped_in_a_row >= options_.max_skipped_steps) {
        // The weights are still those before this step: save them, so the run resumes from its last good state.
        if (schedule.due_before_failing(i)) save_now();
        fail(fmt::format("{}; stopped{} (lower --lr, or --on-nan skip)", what,
                         save ? fmt::format(" with a checkpoint of iteration {}", i) : std::string()));
      }
      log::warning("{}: update skipped ({} in a row)", what, skipped_in_a_row);
      s.skipped = true;
    } else {
      skipped_in_a_row = 0;
    }
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.iteration = i + 1;
    s.lr = lr;
    s.tokens_per_second = tokens_per_iteration / s.seconds;
    stats.push_back(s);
    progress_.iteration = i + 1;
    progress_.consumed_samples += options_.global_batch_size;
    IterationReport report;
    report.iteration = s.iteration;
    report.consumed_samples = progress_.consumed_samples;
    report.loss = s.loss;
    report.lr = lr;
    report.megatron_lr = schedule_.at(s.iteration);
    report.grad_norm = s.grad_norm;
    report.seconds = s.seconds;
    report.skipped = s.skipped;
    if (monitor.wants_norms(s.iteration, model_.device_training() != nullptr)) {
      if (options_.monitor.log_params_norm) report.params_norm = params_norm();
      if (options_.monitor.log_num_zeros_in_grad) report.num_zeros = step_->zeros_in_gradients();
    }
    if (monitor.wants_memory(s.iteration)) report.memory = memory_report();
    report.moe = moe_;
    monitor.iteration(report);
    if (options_.eval_interval > 0 && s.iteration % options_.eval_interval == 0 && do_valid)
      monitor.validation(s.iteration, progress_.consumed_samples, evaluate());
    bool stopping = (stop && stop->load()) ||
                    (options_.exit_interval > 0 && s.iteration % options_.exit_interval == 0);
    if (dp_ && dp_->size() > 1) {
      // A signal may reach some ranks only: they stop together, after the same iteration.
      std::int32_t any = stopping ? 1 : 0;
      dp_->all_reduce(std::span<std::int32_t>(&any, 1), ReduceOp::kMax);
      stopping = any != 0;
    }
    if (schedule.due(s.iteration, stopping)) save_now();
    else if (schedule.non_persistent_due(s.iteration, stopping))
      save_through(save_non_persistent);
    if (stopping) {
      if (reporting) log::info("stopping at iteration {} ({})", s.iteration, save ? "checkpoint saved" : "no --save: no checkpoint");
      stopped_early = true;
      break;
    }
  }
  // The end of Megatron's pretrain(): the validation split once more (its iterator continuing), then the test
  // split, each printed as evaluate_and_print_results prints it (loss and perplexity, "lm loss" being the
  // language model's loss).
  if (!stopped_early && progress_.iteration >= options_.train_iters) {
    if (do_valid) monitor.validation(progress_.iteration, progress_.consumed_samples, evaluate(), EvaluatedSet::kValidation);
    if (test_ && options_.eval_iters > 0)
      monitor.validation(progress_.iteration, progress_.consumed_samples, evaluate_test(), EvaluatedSet::kTest);
  }
  return stats;
}

double unigram_entropy(const SampleSource& source, std::int64_t seq_length, std::uint64_t samples) {
  std::unordered_map<std::int32_t, std::uint64_t> counts;
  std::vector<std::int32_t> sample(static_cast<std::size_t>(seq_length + 1));
  std::uint64_t total = 0;
  samples = std::min(samples, source.size());
  for (std::uint64_t i = 0; i < samples; ++i) {
    source.read(i, sample);
    for (std::size_t j = 1; j < sample.size(); ++j) ++counts[sample[j]], ++total;
  }
  double h = 0;
  for (const auto& [id, c] : counts) {
    const double p = static_cast<double>(c) / static_cast<double>(total);
    h -= p * std::log(p);
  }
  return h;
}

}  // namespace dlm::train
