// The trainer's reports in Megatron's forms (include/dlm/train/training_monitor.h).
#include "dlm/train/training_monitor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/megatron_log.h"
#include "dlm/train/metrics.h"
#include "dlm/train/progress_log.h"
#include "dlm/train/trainer.h"

namespace dlm::train {
namespace {

// Scalars by step: the iteration's tags and their "vs samples" twins go to two steps.
using Scalars = std::map<std::int64_t, std::map<std::string, double>>;

void with_samples(Scalars& out, std::int64_t iteration, std::int64_t samples, const std::string& tag, double v) {
  out[iteration][tag] = v;
  out[samples][tag + " vs samples"] = v;
}

// Beside dlm's other log lines on stderr (Megatron prints on stdout; launch scripts log both streams), without
// dlm's "[time level]" prefix so that the line is Megatron's.
void print_log(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

// Megatron's tags (moe_metrics.h) and dlm's load: moe/tokens_per_expert_layer_<i>/expert_<e>.
void add_moe_scalars(std::map<std::string, double>& out, const MoeMetrics& m) {
  for (const auto& [name, value] : m.losses()) out[name] = value;
  for (const auto& l : m.layers) {
    if (m.z) out[fmt::format("moe/z_loss_layer_{}", l.layer)] = l.z_loss;
    if (m.load_balancing) out[fmt::format("moe/load_balancing_loss_layer_{}", l.layer)] = l.load_balancing_loss;
    for (std::size_t e = 0; e < l.tokens_per_expert.size(); ++e)
      out[fmt::format("moe/tokens_per_expert_layer_{}/expert_{}", l.layer, e)] = l.tokens_per_expert[e];
  }
}

}  // namespace

TrainingMonitor::TrainingMonitor(const TrainerOptions& o, bool reporting, std::int64_t start_iteration)
    : options_(o.monitor), train_iters_(o.train_iters), global_batch_size_(o.global_batch_size),
      seq_length_(o.seq_length), log_interval_(o.log_interval), first_iteration_(start_iteration + 1),
      reporting_(reporting), tensorboard_(!o.tensorboard_dir.empty()) {
  if (options_.tensorboard_log_interval < 1)
    fail(fmt::format("--tensorboard-log-interval: {} must be positive", options_.tensorboard_log_interval));
  if (!reporting_) return;
  if (tensorboard_) tb_ = std::make_unique<TensorBoardWriter>(o.tensorboard_dir, options_.tensorboard_queue_size);
  if (!o.metrics_path.empty()) jsonl_ = std::make_unique<JsonlMetrics>(o.metrics_path);
  if (!options_.progress_dir.empty())
    progress_ = std::make_unique<ProgressLog>(options_.progress_dir, options_.job_id, options_.world_size,
                                              static_cast<double>(start_iteration) * options_.flops_per_iteration);
}

TrainingMonitor::~TrainingMonitor() = default;

bool TrainingMonitor::log_line_due(std::int64_t iteration) const {
  return iteration % log_interval_ == 0 || iteration == train_iters_ || iteration == first_iteration_;
}

bool TrainingMonitor::wants_norms(std::int64_t iteration, bool costly) const {
  if (!options_.log_params_norm && !options_.log_num_zeros_in_grad) return false;
  return log_line_due(iteration) || (!costly && tensorboard_ && iteration % options_.tensorboard_log_interval == 0);
}

bool TrainingMonitor::wants_memory(std::int64_t iteration) const {
  return reporting_ && tb_ && options_.log_memory_to_tensorboard && iteration % options_.tensorboard_log_interval == 0;
}

void TrainingMonitor::iteration(const IterationReport& r) {
  seconds_ += r.seconds;
  loss_sum_ += r.loss;
  ++count_;
  if (r.skipped) {
    ++skipped_;
    nan_ += std::isfinite(r.loss) ? 0 : 1;
  } else {
    applied_loss_sum_ += r.loss;
    ++applied_;
    if (r.moe) {
      const auto losses = r.moe->losses();
      if (moe_loss_sums_.empty())
        for (const auto& [name, value] : losses) moe_loss_sums_.emplace_back(name, 0.0);
      for (std::size_t i = 0; i < losses.size() && i < moe_loss_sums_.size(); ++i) moe_loss_sums_[i].second += losses[i].second;
    }
  }
  if (!reporting_) return;
  if (tb_ && r.iteration % options_.tensorboard_log_interval == 0) {
    Scalars s;
    const std::int64_t it = r.iteration, samples = r.consumed_samples;
    with_samples(s, it, samples, "learning-rate", r.megatron_lr);
    with_samples(s, it, samples, "batch-size", static_cast<double>(global_batch_size_));
    with_samples(s, it, samples, "lm loss", r.loss);
    with_samples(s, it, samples, "loss-scale", 1.0);
    with_samples(s, it, samples, "grad-norm", r.grad_norm);
    if (r.num_zeros) with_samples(s, it, samples, "num-zeros", static_cast<double>(*r.num_zeros));
    if (r.params_norm) with_samples(s, it, samples, "params-norm", *r.params_norm);
    if (r.memory) {
      s[it]["mem-reserved-bytes"] = r.memory->reserved_bytes;
      s[it]["mem-allocated-bytes"] = r.memory->allocated_bytes;
      s[it]["mem-max-allocated-bytes"] = r.memory->max_allocated_bytes;
    }
    if (r.moe) add_moe_scalars(s[it], *r.moe);
    for (const auto& [step, scalars] : s) tb_->add_scalars(step, scalars);
  }
  if (log_line_due(r.iteration)) {
    // Megatron's line after the job's first iteration leaves the interval open (it documents the start-up cost).
    const bool closes = r.iteration % log_interval_ == 0 || r.iteration == train_iters_;
    write_log_line(r, closes);
  }
}

void TrainingMonitor::write_log_line(const IterationReport& r, bool closes_interval) {
  const double per_iteration = seconds_ / static_cast<double>(count_);
  IterationLogLine l;
  l.iteration = r.iteration;
  l.train_iters = train_iters_;
  l.consumed_samples = r.consumed_samples;
  l.global_batch_size = global_batch_size_;
  l.ms_per_iteration = per_iteration * 1000.0;
  const double tflops = options_.flops_per_iteration / (per_iteration * 1e12 * options_.world_size);
  if (options_.log_throughput) l.tflops_per_gpu = tflops;
  l.learning_rate = r.megatron_lr;
  l.lm_loss = applied_loss_sum_ / static_cast<double>(std::max<std::int64_t>(1, applied_));
  for (const auto& [name, sum] : moe_loss_sums_) l.extra_losses.emplace_back(name, sum / static_cast<double>(std::max<std::int64_t>(1, applied_)));
  l.grad_norm = r.grad_norm;
  l.num_zeros = r.num_zeros;
  l.params_norm = r.params_norm;
  l.skipped_iterations = skipped_;
  l.nan_iterations = nan_;
  print_log(megatron_iteration_line(l, std::chrono::system_clock::now()) + "\n");
  if (r.moe) print_log(moe_load_line(*r.moe) + "\n");
  if (tb_ && options_.log_timers_to_tensorboard && r.iteration != first_iteration_) {
    std::map<std::string, double> timers = {{"iteration-time", per_iteration}};
    if (options_.log_throughput) timers["throughput"] = tflops;
    tb_->add_scalars(r.iteration, timers);
  }
  if (!closes_interval) return;
  if (jsonl_) {
    const double tokens_per_second = static_cast<double>(global_batch_size_ * seq_length_) / per_iteration;
    std::map<std::string, double> values = {{"loss", loss_sum_ / static_cast<double>(count_)},
                                            {"lr", r.lr},
                                            {"grad_norm", r.grad_norm},
                                            {"tokens_per_second", tokens_per_second},
                                            {"consumed_samples", static_cast<double>(r.consumed_samples)}};
    if (r.params_norm) values["params_norm"] = *r.params_norm;
    if (r.num_zeros) values["num_zeros"] = static_cast<double>(*r.num_zeros);
    if (options_.log_throughput) values["tflops_per_gpu"] = tflops;
    for (const auto& [name, value] : l.extra_losses) values[name] = value;
    if (r.moe) values["moe_max_load"] = moe_max_load(*r.moe);
    jsonl_->write(r.iteration, values);
  }
  if (tb_) tb_->flush();
  moe_loss_sums_.clear();
  seconds_ = loss_sum_ = applied_loss_sum_ = 0;
  count_ = applied_ = skipped_ = nan_ = 0;
}

void TrainingMonitor::validation(std::int64_t iteration, std::int64_t consumed_samples, double loss,
                                 EvaluatedSet set) {
  if (!reporting_) return;
  const bool test = set == EvaluatedSet::kTest;
  print_log(megatron_validation_block(iteration, loss,
                                      set == EvaluatedSet::kPeriodic ? "" : test ? " on test set" : " on validation set"));
  if (jsonl_) jsonl_->write(iteration, {{test ? "test_loss" : "valid_loss", loss}});
  if (!tb_) return;
  Scalars s;
  const std::string tag = test ? "lm loss test" : "lm loss validation";
  with_samples(s, iteration, consumed_samples, tag, loss);
  if (options_.log_validation_ppl_to_tensorboard) with_samples(s, iteration, consumed_samples, tag + " ppl", megatron_ppl(loss));
  for (const auto& [step, scalars] : s) tb_->add_scalars(step, scalars);
  tb_->flush();
}

void TrainingMonitor::saved(std::int64_t iteration, std::int64_t consumed_samples) {
  if (progress_)
    progress_->saved_checkpoint(iteration, static_cast<double>(iteration) * options_.flops_per_iteration,
                                static_cast<double>(consumed_samples * seq_length_));
}

}  // namespace dlm::train
