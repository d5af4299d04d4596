#include <cmath>

#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "dlm/train/lr_schedule.h"
#include "dlm/train/optimizer.h"

namespace dlm::train {
namespace {

TEST(AdamW, FirstStepIsSignTimesLrPlusDecay) {
  // Step 1: m^ = g, v^ = g^2, so the update is lr * g / (|g| + eps) after p *= 1 - lr * wd.
  std::vector<float> w = {1.0f, -2.0f}, n = {3.0f};
  std::vector<float> gw = {0.5f, -0.25f}, gn = {1.0f};
  AdamW opt({0.9, 0.95, 1e-8, 0.1});
  std::vector<ParamRef> params = {{"w", w, gw, true}, {"norm", n, gn, false}};
  opt.step(params, 0.01);
  EXPECT_NEAR(w[0], 1.0 * (1 - 0.001) - 0.01, 1e-6);
  EXPECT_NEAR(w[1], -2.0 * (1 - 0.001) + 0.01, 1e-6);
  EXPECT_NEAR(n[0], 3.0 - 0.01, 1e-6);  // no decay on norms
  EXPECT_EQ(opt.steps(), 1);
  // Step 2 with the same gradient: still exactly lr * sign(g) (bias correction cancels).
  opt.step(params, 0.01);
  EXPECT_NEAR(n[0], 3.0 - 0.02, 1e-6);
}

TEST(Clipping, ScalesToTheMaximumNorm) {
  std::vector<float> a = {3.0f}, b = {4.0f};
  std::vector<std::span<float>> grads = {a, b};
  EXPECT_DOUBLE_EQ(clip_grad_norm(grads, 10.0), 5.0);
  EXPECT_EQ(a[0], 3.0f);  // below the limit: untouched
  EXPECT_DOUBLE_EQ(clip_grad_norm(grads, 1.0), 5.0);
  EXPECT_NEAR(a[0], 0.6, 1e-6);
  EXPECT_NEAR(b[0], 0.8, 1e-6);
}

TEST(LrSchedule, WarmupThenCosine) {
  LrSchedule s({1e-3, 1e-4, 0.0, 10, 110, LrDecayStyle::kCosine, 0, WsdDecayStyle::kExponential});
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);
  EXPECT_NEAR(s.at(60), 1e-4 + 0.5 * 9e-4, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(500), 1e-4);
}

TEST(LrSchedule, WsdExponentialTail) {
  LrSchedule s({2e-4, 2e-5, 0.0, 20, 100, LrDecayStyle::kWsd, 40, WsdDecayStyle::kExponential});
  EXPECT_DOUBLE_EQ(s.at(60), 2e-4);  // stable until decay_iters - wsd_decay_iters
  EXPECT_NEAR(s.at(80), 2e-5 + (2 * std::sqrt(0.5) - 1) * 1.8e-4, 1e-15);
  EXPECT_NEAR(s.at(100), 2e-5, 1e-15);
}

// Megatron's sample counts that are not whole iterations: the scheduler steps by the global batch (8), so warmup
// 12 samples ends inside iteration 2, and decay 100 samples inside iteration 13.
TEST(LrSchedule, SampleCountsInsideAnIteration) {
  LrScheduleOptions o{1e-3, 0.0, 0.0, 0, 0, LrDecayStyle::kLinear, 0, WsdDecayStyle::kLinear, 8};
  o.warmup_samples = 12;
  o.decay_samples = 100;
  LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.at(1), 1e-3 * 8 / 12);            // step 8 <= 12: warmup
  EXPECT_DOUBLE_EQ(s.at(2), 1e-3 * (1 - 4.0 / 88));    // step 16: decay ratio (16 - 12) / (100 - 12)
  EXPECT_DOUBLE_EQ(s.at(12), 1e-3 * (1 - 84.0 / 88));  // step 96 <= 100
  EXPECT_DOUBLE_EQ(s.at(13), 0.0);                     // step 104 > 100: --min-lr
  o.warmup_samples = 100;
  EXPECT_THROW(LrSchedule{o}, Error);  // warmup must end before the decay (Megatron's assertion)
}

TEST(LrSchedule, RejectsInconsistentFlags) {
  EXPECT_THROW(LrSchedule({1e-3, 1e-2, 0.0, 0, 10, LrDecayStyle::kLinear, 0, WsdDecayStyle::kLinear}), Error);
  EXPECT_THROW(LrSchedule({1e-3, 0.0, 0.0, 10, 10, LrDecayStyle::kLinear, 0, WsdDecayStyle::kLinear}), Error);
  EXPECT_THROW(LrSchedule({1e-3, 0.0, 0.0, 1, 10, LrDecayStyle::kWsd, 0, WsdDecayStyle::kLinear}), Error);
  EXPECT_THROW(parse_lr_decay_style("exp"), Error);
}

}  // namespace
}  // namespace dlm::train

#include "dlm/train/metrics.h"

namespace dlm::train {
namespace {
TEST(Crc32c, KnownAnswer) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}
}  // namespace
}  // namespace dlm::train
