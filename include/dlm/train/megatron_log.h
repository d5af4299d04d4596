// Megatron-LM's text log, character for character, so that log parsers and dashboards written for
// Megatron (and MegaDLMs) read dlm-train's output: megatron/training/training.py, training_log() and
// evaluate_and_print_results(), at Megatron-LM d98e8a64.
//
// The iteration line (one line, fields in this order, each ending " |"; optional ones only when set):
//   " [%Y-%m-%d %H:%M:%S.%f] iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration (ms): %.1f |"
//   " throughput per GPU (TFLOP/s/GPU): %.1f |"       (--log-throughput)
//   " learning rate: %.6E | global batch size: %5d | lm loss: %.6E |"   (lm loss only when >= 0, as Megatron)
//   " z_loss: %.6E | load_balancing_loss: %.6E |"     (an MoE model's tracked router losses, moe_metrics.h)
//   " loss scale: 1.0 | grad norm: %.3f |"
//   " num zeros: %d |"                                 (--log-num-zeros-in-grad)
//   " params norm: %.3f |"                             (--log-params-norm)
//   " number of skipped iterations: %3d | number of nan iterations: %3d |"
// The validation block: a line of dashes, " validation loss at iteration N | lm loss value: %.6E | lm loss PPL:
// %.6E | " (PPL = exp(min(20, loss))), the same dashes; the dashes are one longer than the middle line.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dlm::train {

struct IterationLogLine {
  std::int64_t iteration = 0, train_iters = 0, consumed_samples = 0, global_batch_size = 0;
  double ms_per_iteration = 0;
  std::optional<double> tflops_per_gpu;  // --log-throughput
  double learning_rate = 0;
  double lm_loss = 0;  // mean over the interval's applied iterations
  std::vector<std::pair<std::string, double>> extra_losses;  // after lm loss, in order (Megatron's total_loss_dict)
  double grad_norm = 0;
  std::optional<std::int64_t> num_zeros;  // --log-num-zeros-in-grad
  std::optional<double> params_norm;  // --log-params-norm
  std::int64_t skipped_iterations = 0, nan_iterations = 0;
};

// "YYYY-mm-dd HH:MM:SS.ffffff" in local time (Python's datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')).
std::string megatron_timestamp(std::chrono::system_clock::time_point t);
// The iteration line, without a newline.
std::string megatron_iteration_line(const IterationLogLine& l, std::chrono::system_clock::time_point now);
// The three lines of the validation block, each ending in '\n'.
// `which`: "" for the periodic evaluation, " on validation set" / " on test set" for the ones at the end of training.
std::string megatron_validation_block(std::int64_t iteration, double lm_loss, std::string_view which = "");
// Megatron's perplexity: exp(min(20, loss)).
double megatron_ppl(double lm_loss);

}  // namespace dlm::train
