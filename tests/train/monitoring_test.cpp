// Megatron's monitoring formats (megatron_log.h, flops.h, progress_log.h, metrics.h's queue): the strings are
// written out here from Megatron-LM's format strings (training.py, training_log and evaluate_and_print_results).
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "dlm/train/flops.h"
#include "dlm/train/megatron_log.h"
#include "dlm/train/metrics.h"
#include "dlm/train/moe_metrics.h"
#include "dlm/train/progress_log.h"

namespace dlm::train {
namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(MegatronLog, IterationLineIsMegatronsCharacterForCharacter) {
  IterationLogLine l;
  l.iteration = 20;
  l.train_iters = 1000;
  l.consumed_samples = 5120;
  l.ms_per_iteration = 1234.5678;
  l.learning_rate = 3e-4;
  l.global_batch_size = 256;
  l.lm_loss = 7.123456789;
  l.grad_norm = 1.23456;
  l.skipped_iterations = 0;
  l.nan_iterations = 0;
  const std::string line = megatron_iteration_line(l, std::chrono::system_clock::now());
  const std::string tail =
      " iteration       20/    1000 | consumed samples:         5120 | elapsed time per iteration (ms): 1234.6 |"
      " learning rate: 3.000000E-04 | global batch size:   256 | lm loss: 7.123457E+00 | loss scale: 1.0 |"
      " grad norm: 1.235 | number of skipped iterations:   0 | number of nan iterations:   0 |";
  ASSERT_GE(line.size(), tail.size());
  EXPECT_EQ(line.substr(line.size() - tail.size()), tail) << line;
  EXPECT_TRUE(std::regex_match(line.substr(0, line.size() - tail.size()),
                               std::regex(R"( \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\])")))
      << line;

  // The optional fields in Megatron's places; a negative (or NaN) mean loss is left out, as there.
  l.tflops_per_gpu = 412.345;
  l.num_zeros = 17;
  l.params_norm = 250.5;
  l.lm_loss = std::nan("");
  l.skipped_iterations = 2;
  l.nan_iterations = 1;
  const std::string full = megatron_iteration_line(l, std::chrono::system_clock::now());
  const std::string full_tail =
      " iteration       20/    1000 | consumed samples:         5120 | elapsed time per iteration (ms): 1234.6 |"
      " throughput per GPU (TFLOP/s/GPU): 412.3 | learning rate: 3.000000E-04 | global batch size:   256 |"
      " loss scale: 1.0 | grad norm: 1.235 | num zeros: 17 | params norm: 250.500 |"
      " number of skipped iterations:   2 | number of nan iterations:   1 |";
  EXPECT_EQ(full.substr(full.size() - full_tail.size()), full_tail) << full;
}

// Three layers (layer 1 dense), two experts, two micro-batches: the sums become per-micro-batch losses of the MoE
// layers, Megatron's scalars are their means (z_loss first), and the load is the busiest expert over the mean.
TEST(MoeMetrics, HandComputedSumsGiveMegatronsScalarsAndTheLoad) {
  MoeStepSums sums;
  sums.experts = 2;
  sums.load_balancing = sums.z = true;
  sums.values = {2.0, 0.5, 30, 10, 0, 0, 0, 0, 2.4, 0.7, 20, 20};
  const MoeMetrics m = moe_metrics(sums, 2);
  ASSERT_EQ(m.layers.size(), 2u);
  EXPECT_EQ(m.layers[0].layer, 0);
  EXPECT_EQ(m.layers[1].layer, 2);
  EXPECT_DOUBLE_EQ(m.layers[0].load_balancing_loss, 1.0);
  EXPECT_DOUBLE_EQ(m.layers[1].z_loss, 0.35);
  EXPECT_EQ(m.layers[0].tokens_per_expert, (std::vector<double>{30, 10}));
  const auto losses = m.losses();
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_EQ(losses[0].first, "z_loss");
  EXPECT_DOUBLE_EQ(losses[0].second, 0.3);
  EXPECT_EQ(losses[1].first, "load_balancing_loss");
  EXPECT_DOUBLE_EQ(losses[1].second, 1.1);
  EXPECT_EQ(moe_load_line(m), " moe load (max / mean tokens per expert) | layer 0: 1.500 | layer 2: 1.000 |");
  EXPECT_DOUBLE_EQ(moe_max_load(m), 1.5);
  sums.z = false;  // a zero coefficient: not tracked, as in Megatron
  EXPECT_EQ(moe_metrics(sums, 2).losses().size(), 1u);

  IterationLogLine l;
  l.iteration = 1;
  l.train_iters = 10;
  l.lm_loss = 7.0;
  l.extra_losses = losses;
  const std::string line = megatron_iteration_line(l, std::chrono::system_clock::now());
  EXPECT_NE(line.find(" lm loss: 7.000000E+00 | z_loss: 3.000000E-01 | load_balancing_loss: 1.100000E+00 | loss scale: 1.0 |"),
            std::string::npos) << line;
}

TEST(MegatronLog, ValidationBlockAndPerplexity) {
  const std::string mid = " validation loss at iteration 100 | lm loss value: 2.500000E+00 | lm loss PPL: 1.218249E+01 | ";
  const std::string dashes(mid.size() + 1, '-');
  EXPECT_EQ(megatron_validation_block(100, 2.5), dashes + "\n" + mid + "\n" + dashes + "\n");
  EXPECT_DOUBLE_EQ(megatron_ppl(30.0), std::exp(20.0));  // Megatron caps the exponent at 20
}

TEST(MegatronLog, TimestampHasMicroseconds) {
  const auto t = std::chrono::system_clock::from_time_t(1'700'000'000) + std::chrono::microseconds(42);
  const std::string s = megatron_timestamp(t);
  EXPECT_TRUE(std::regex_match(s, std::regex(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.000042)"))) << s;
}

// MegaDLMs' 1.7B (28 layers, hidden 2048, ffn 6144, 16 heads, head dim 128, vocabulary 50304, sequence 2048, global
// batch 256), by Megatron's formula: 5.496e15 per iteration, about 6 x 1.7e9 per token plus attention.
TEST(MegatronFlops, TheOneSevenBModel) {
  const FlopsShape s{28, 2048, 6144, 16, 16, 128, 50304, 2048, 256};
  EXPECT_EQ(megatron_flops_per_iteration(s), 5496183749345280.0);
  FlopsShape gqa = s;
  gqa.query_groups = 4;  // fewer K and V projections: 2 x (16 - 4) x 128 x 2048 x 6 per token and layer less
  EXPECT_EQ(megatron_flops_per_iteration(s) - megatron_flops_per_iteration(gqa), 256.0 * 2048 * 28 * 6 * 2048 * 2 * 12 * 128);
}

TEST(ProgressLog, MegatronsLinesAndTheCumulativeStart) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "dlm_progress_log";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // An earlier job of another world size, then one of this size whose last checkpoint held 1e15 FLOPs: the
  // cumulative count starts at the first "Starting job" after the size changed, from the FLOPs saved before it.
  std::ofstream(dir / "progress.txt") << "2020-01-01 00:00:00\tJob ID: 1\t# GPUs: 4\tStarting job\n"
                                      << "2020-01-01 00:10:00\tJob ID: 1\t# GPUs: 4\tSaved checkpoint\tIteration: 5\t"
                                         "Job throughput: 1.0 TFLOP/s/GPU\tCumulative throughput: 1.0 TFLOP/s/GPU\t"
                                         "Floating-point operations: 1.00e+15\tTokens (in billions): 0.00\n";
  {
    ProgressLog log(dir.string(), "77", 8, 1e15);
    log.saved_checkpoint(10, 2e15, 3.5e9);
  }
  const std::string text = read_all(dir / "progress.txt");
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u) << text;
  EXPECT_TRUE(std::regex_match(lines[2], std::regex(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\tJob ID: 77\t# GPUs: 8\tStarting job)")))
      << lines[2];
  EXPECT_TRUE(std::regex_match(lines[3], std::regex(R"(.*\tJob ID: 77\t# GPUs: 8\tSaved checkpoint\tIteration: 10\t)"
                                                    R"(Job throughput: [0-9.]+ TFLOP/s/GPU\t)"
                                                    R"(Cumulative throughput: [0-9.]+ TFLOP/s/GPU\t)"
                                                    R"(Floating-point operations: 2\.00e\+15\tTokens \(in billions\): 3\.50)")))
      << lines[3];
  // 1e15 FLOPs of this job over 8 GPUs in well under a second: above 125 TFLOP/s/GPU (at least 1 ms is counted).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(lines[3], m, std::regex(R"(Job throughput: ([0-9.]+).*Cumulative throughput: ([0-9.]+))")));
  EXPECT_GT(std::stod(m[1]), 125.0);
  EXPECT_GT(std::stod(m[2]), 0.0);
}

TEST(TensorBoardWriter, HoldsQueueSizeEventsBeforeWriting) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "dlm_tb_queue";
  std::filesystem::remove_all(dir);
  TensorBoardWriter tb(dir.string(), 3);
  const auto size = [&] { return std::filesystem::file_size(tb.path()); };
  const auto header = size();  // the file_version record is written at once
  tb.add_scalars(1, {{"lm loss", 1.0}});
  tb.add_scalars(2, {{"lm loss", 2.0}});
  EXPECT_EQ(size(), header);
  tb.add_scalars(3, {{"lm loss", 3.0}});
  EXPECT_GT(size(), header);
  const auto three = size();
  tb.add_scalars(4, {{"lm loss", 4.0}});
  EXPECT_EQ(size(), three);
  tb.flush();
  EXPECT_GT(size(), three);
}

}  // namespace
}  // namespace dlm::train
