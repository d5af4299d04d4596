// Megatron's log line and validation block (include/dlm/train/megatron_log.h).
#include "dlm/train/megatron_log.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

namespace dlm::train {

std::string megatron_timestamp(std::chrono::system_clock::time_point t) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(t);
  std::tm local{};
  localtime_r(&seconds, &local);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", &local);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(t - std::chrono::system_clock::from_time_t(seconds)).count();
  return fmt::format("{}.{:06}", date, micros);
}

std::string megatron_iteration_line(const IterationLogLine& l, std::chrono::system_clock::time_point now) {
  std::string s = fmt::format(" [{}]", megatron_timestamp(now));
  s += fmt::format(" iteration {:8d}/{:8d} |", l.iteration, l.train_iters);
  s += fmt::format(" consumed samples: {:12d} |", l.consumed_samples);
  s += fmt::format(" elapsed time per iteration (ms): {:.1f} |", l.ms_per_iteration);
  if (l.tflops_per_gpu) s += fmt::format(" throughput per GPU (TFLOP/s/GPU): {:.1f} |", *l.tflops_per_gpu);
  s += fmt::format(" learning rate: {:.6E} |", l.learning_rate);
  s += fmt::format(" global batch size: {:5d} |", l.global_batch_size);
  // Megatron prints a loss only when its mean is >= 0 (a NaN mean fails that test and is left out).
  if (l.lm_loss >= 0.0) s += fmt::format(" lm loss: {:.6E} |", l.lm_loss);
  for (const auto& [name, value] : l.extra_losses) s += fmt::format(" {}: {:.6E} |", name, value);
  s += " loss scale: 1.0 |";  // bf16 and fp32 train without loss scaling
  s += fmt::format(" grad norm: {:.3f} |", l.grad_norm);
  if (l.num_zeros) s += fmt::format(" num zeros: {} |", *l.num_zeros);
  if (l.params_norm) s += fmt::format(" params norm: {:.3f} |", *l.params_norm);
  s += fmt::format(" number of skipped iterations: {:3d} |", l.skipped_iterations);
  s += fmt::format(" number of nan iterations: {:3d} |", l.nan_iterations);
  return s;
}

double megatron_ppl(double lm_loss) { return std::exp(std::min(20.0, lm_loss)); }

std::string megatron_validation_block(std::int64_t iteration, double lm_loss, std::string_view which) {
  const std::string line = fmt::format(" validation loss at iteration {}{} | lm loss value: {:.6E} | lm loss PPL: {:.6E} | ",
                                       iteration, which, lm_loss, megatron_ppl(lm_loss));
  const std::string dashes(line.size() + 1, '-');
  return dashes + "\n" + line + "\n" + dashes + "\n";
}

}  // namespace dlm::train
