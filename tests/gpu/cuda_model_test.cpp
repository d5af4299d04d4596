// CudaModel beside the CPU Model and itself: init(seed) draws Model::init's weights, and the sampling
// path's greedy tokens (captured as a CUDA graph after the first call of a shape, then replayed on new
// inputs) are the argmax of the very logits forward_logits returns (an eager run), call after call.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dlm/ckpt/model_config.h"
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

}  // namespace
}  // namespace dlm::train
