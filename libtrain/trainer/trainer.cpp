// The training loop (see include/dlm/train/trainer.h for the data order and resume contract).
#include "dlm/train/trainer.h"

#include <chrono>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "dlm/train/batch_plan.h"
#include "dlm/train/checkpoint_saver.h"
#include "dlm/train/metrics.h"
#include "gradient_step.h"

namespace dlm::train {
namespace {

// Validation draws its masks from a stream of its own, so that its samples never share noise with
// the training samples of the same index.
constexpr std::uint64_t kValidationSeedSalt = 0x9e3779b97f4a7c15ull;

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

std::string eta(double seconds) {
  auto s = static_cast<std::int64_t>(seconds);
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
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
  if (options_.eval_interval > 0 && options_.eval_iters > 0) {
    if (!valid_) fail("--eval-interval needs validation data (--split with a valid part, or --valid-data-path)");
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
  progress_ = progress;
  step_->load_optimizer_state(std::move(optimizer_state));
}

AdamW Trainer::optimizer_state() const {
  AdamW whole{options_.adam};
  step_->with_optimizer_state([&](const AdamW& state) { whole = state; });
  return whole;
}

SampleBatch Trainer::read_batch(const SampleSource& source, std::uint64_t first) const {
  const std::int64_t b = options_.micro_batch_size, l = options_.seq_length;
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
  double loss = model_.forward_backward_all(batches);
  model_.finish_gradients();
  step_->after_backward();
  const StepResult result = step_->apply(loss, lr);
  grad_norm = result.grad_norm;
  applied = result.applied;
  return loss;
}

double Trainer::evaluate() {
  if (!valid_ || options_.eval_iters <= 0) return std::nan("");
  ObjectiveOptions objective = options_.objective;
  objective.seed ^= kValidationSeedSalt;
  const std::int64_t micro = plan_.micro_batches();
  double total = 0;
  for (std::int64_t i = 0; i < options_.eval_iters; ++i) {
    std::vector<ModelBatch> batches;
    for (std::int64_t k = 0; k < plan_.micro_batches_per_rank(); ++k) {
      const std::int64_t m = plan_.micro_batch(dp_rank_, k);
      batches.push_back(make_model_batch(objective, read_batch(*valid_, plan_.first_sample(i, m)), {i, micro, m, false}));
    }
    total += model_.forward_loss_all(batches);
  }
  if (plan_.data_parallel() > 1) dp_->all_reduce(std::span<double>(&total, 1));
  return total / static_cast<double>(options_.eval_iters * micro);
}

std::vector<IterationStats> Trainer::run(const SaveFn& save, const std::atomic<bool>* stop) {
  std::optional<TensorBoardWriter> tb;
  std::optional<JsonlMetrics> jsonl;
  // One replica reports: the losses and norms are the group's on every rank.
  const bool reporting = (!dp_ || dp_->rank() == 0) && model_.reports();
  if (reporting && !options_.tensorboard_dir.empty()) tb.emplace(options_.tensorboard_dir);
  if (reporting && !options_.metrics_path.empty()) jsonl.emplace(options_.metrics_path);
  // When to save: checkpoint_saver.h.
  SaveSchedule schedule(options_.save_interval, options_.train_iters, options_.checkpoint_steps);
  const auto save_now = [&] {
    if (!save) return;
    step_->with_optimizer_state([&](const AdamW& whole) { save(progress_, model_, whole); });
    schedule.saved(progress_.iteration);
  };
  std::vector<IterationStats> stats;
  const double tokens_per_iteration = static_cast<double>(options_.global_batch_size * options_.seq_length);
  const auto start = std::chrono::steady_clock::now();
  double window_seconds = 0, window_loss = 0;
  std::int64_t window = 0, skipped_in_a_row = 0;
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
    window_seconds += s.seconds;
    window_loss += s.loss;
    ++window;
    if (reporting && (s.iteration % options_.log_interval == 0 || s.iteration == options_.train_iters)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double per_iteration = elapsed / static_cast<double>(stats.size());
      const double tps = tokens_per_iteration * static_cast<double>(window) / window_seconds;
      log::info("iteration {:>7}/{} | loss {:.6f} | lr {:.4e} | grad norm {:.4f} | tokens/s {:.0f} | ETA {}",
                s.iteration, options_.train_iters, window_loss / static_cast<double>(window), lr, s.grad_norm, tps,
                eta(per_iteration * static_cast<double>(options_.train_iters - s.iteration)));
      std::map<std::string, double> values = {{"loss", window_loss / static_cast<double>(window)}, {"lr", lr},
                                              {"grad_norm", s.grad_norm}, {"tokens_per_second", tps},
                                              {"consumed_samples", static_cast<double>(progress_.consumed_samples)}};
      if (jsonl) jsonl->write(s.iteration, values);
      if (tb)
        tb->add_scalars(s.iteration, {{"train/loss", values["loss"]}, {"train/lr", lr}, {"train/grad_norm", s.grad_norm},
                                      {"train/tokens_per_second", tps}});
      window = 0;
      window_seconds = window_loss = 0;
    }
    if (options_.eval_interval > 0 && s.iteration % options_.eval_interval == 0 && valid_) {
      const double v = evaluate();
      if (reporting) log::info("validation at iteration {} | loss {:.6f} | ppl {:.3f}", s.iteration, v, std::exp(v));
      if (jsonl) jsonl->write(s.iteration, {{"valid_loss", v}});
      if (tb) tb->add_scalars(s.iteration, {{"valid/loss", v}});
    }
    bool stopping = (stop && stop->load()) ||
                    (options_.exit_interval > 0 && s.iteration % options_.exit_interval == 0);
    if (dp_ && dp_->size() > 1) {
      // A signal may reach some ranks only: they stop together, after the same iteration.
      std::int32_t any = stopping ? 1 : 0;
      dp_->all_reduce(std::span<std::int32_t>(&any, 1), ReduceOp::kMax);
      stopping = any != 0;
    }
    if (schedule.due(s.iteration, stopping)) save_now();
    if (stopping) {
      if (reporting) log::info("stopping at iteration {} ({})", s.iteration, save ? "checkpoint saved" : "no --save: no checkpoint");
      break;
    }
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
