// CudaModel beside the CPU Model and itself: init(seed) draws Model::init's weights, and the sampling
// path's greedy tokens (captured as a CUDA graph after the first call of a shape, then replayed on new
// inputs) are the argmax of the very logits forward_logits returns (an eager run), call after call.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/common/error.h"
#include "dlm/train/backend.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/model.h"
#include "gpu_test_util.h"

namespace dlm::train {
namespace {

using gpu_test::small_config;

TEST(CudaModel, InitDrawsTheCpuModelsWeights) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = small_config();
  auto cpu = make_cpu_backend(1);
  Model model(c, *cpu);
  model.init(7);
  CudaModel gpu(c);
  gpu.init(7);
  double worst = 0;
  for (const auto& p : model.parameters()) {
    const auto want = model.export_parameter(p.spec.name), got = gpu.export_parameter(p.spec.name);
    ASSERT_EQ(want.size(), got.size());
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::abs(want[i] - got[i])));
  }
  EXPECT_LE(worst, 1e-7);
}

TEST(CudaModel, GraphedGreedyTokensAreTheArgmaxOfTheLogits) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = small_config();
  CudaModel gpu(c);
  gpu.init(3);
  std::mt19937 rng(5);
  const std::int64_t batch = 2, seq = 40, n = batch * seq;
  for (int call = 0; call < 4; ++call) {  // eager, captured, replayed, replayed
    std::vector<std::int32_t> ids(n);
    for (auto& t : ids) t = static_cast<std::int32_t>(rng() % 500);
    std::vector<std::int32_t> tokens;
    std::vector<float> confidence;
    gpu.greedy_tokens(batch, seq, false, ids, {}, tokens, confidence);
    const auto logits = gpu.forward_logits(batch, seq, false, ids, {});
    ASSERT_EQ(tokens.size(), static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < n; ++r) {
      const float* row = logits.data() + r * c.vocab_size;
      std::int64_t best = 0;
      for (std::int64_t j = 1; j < c.vocab_size; ++j)
        if (row[j] > row[best]) best = j;
      double sum = 0;
      for (std::int64_t j = 0; j < c.vocab_size; ++j) sum += std::exp(double(row[j]) - row[best]);
      EXPECT_EQ(tokens[r], best) << "call " << call << " row " << r;
      EXPECT_NEAR(confidence[r], 1.0 / sum, 1e-4) << "call " << call << " row " << r;
    }
  }
}

// The samplers ask for a window of columns (the current block): its rows alone reach the output layer,
// and each gives the value the whole-sequence call gives; columns outside read 0. Each window shape is
// eager, then captured, then replayed.
TEST(CudaModel, GreedyTokensOfAWindowAreTheWholeSequencesValuesThere) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = small_config();
  CudaModel gpu(c);
  gpu.init(4);
  std::mt19937 rng(9);
  const std::int64_t batch = 3, seq = 48, n = batch * seq;
  for (int call = 0; call < 6; ++call) {
    const ColumnWindow window = call < 3 ? ColumnWindow{16, 32} : ColumnWindow{5, 48};
    std::vector<std::int32_t> ids(n);
    for (auto& t : ids) t = static_cast<std::int32_t>(rng() % 500);
    std::vector<std::int32_t> tokens, all_tokens;
    std::vector<float> confidence, all_confidence;
    gpu.greedy_tokens(batch, seq, false, ids, {}, tokens, confidence, window);
    gpu.greedy_tokens(batch, seq, false, ids, {}, all_tokens, all_confidence);
    ASSERT_EQ(tokens.size(), static_cast<std::size_t>(n));
    ASSERT_EQ(confidence.size(), static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < batch; ++r)
      for (std::int64_t j = 0; j < seq; ++j) {
        const auto i = static_cast<std::size_t>(r * seq + j);
        if (j < window.first || j >= window.end) {
          EXPECT_EQ(tokens[i], 0) << "call " << call << " row " << r << " column " << j;
          EXPECT_EQ(confidence[i], 0.0f) << "call " << call << " row " << r << " column " << j;
          continue;
        }
        EXPECT_EQ(tokens[i], all_tokens[i]) << "call " << call << " row " << r << " column " << j;
        // The same rows through the same GEMM, fewer of them: cuBLASLt may pick another kernel.
        EXPECT_NEAR(confidence[i], all_confidence[i], 2e-3 * all_confidence[i] + 1e-6)
            << "call " << call << " row " << r << " column " << j;
      }
  }
  std::vector<std::int32_t> tokens;
  std::vector<float> confidence;
  EXPECT_THROW(gpu.greedy_tokens(batch, seq, false, std::vector<std::int32_t>(n, 1), {}, tokens, confidence, {10, 10}),
               dlm::Error);
  EXPECT_THROW(gpu.greedy_tokens(batch, seq, false, std::vector<std::int32_t>(n, 1), {}, tokens, confidence, {0, 49}),
               dlm::Error);
}

}  // namespace
}  // namespace dlm::train
