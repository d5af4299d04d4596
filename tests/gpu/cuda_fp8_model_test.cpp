// CudaModel with FP8 linear layers (CudaOptions::fp8, backend/cuda/fp8_linear.h): a tiny model trained from the
// same initialisation on the same batches follows its bf16 losses, under each recipe and format; full
// recomputation gives the same bits as keeping every activation; the layer choice of --first-last-layers-bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/optimizer.h"
#include "gpu_test_util.h"

namespace dlm::train {
namespace {

// The small test model of `layers` layers with every linear width a multiple of 16 (FP8 GEMMs need it): qkv 256,
// proj 128, fc1 768, fc2 384 wide.
ckpt::ModelConfig fp8_config(int layers) {
  auto c = gpu_test::small_config();
  c.ffn_hidden_size = 384, c.num_layers = layers;
  return c;
}

// A learnable task: each row counts up from a random start (mod 64, tokens 0..63), half its positions masked; the
// masked tokens follow from their neighbours. Weights 1 / masked count: the loss is the mean cross-entropy.
gpu_test::MaskedColumns counting_rows(std::mt19937& rng, std::int64_t batch, std::int64_t seq) {
  gpu_test::MaskedColumns c;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto start = static_cast<std::int32_t>(rng() % 64);
    for (std::int64_t j = 0; j < seq; ++j) {
      c.labels.push_back((start + static_cast<std::int32_t>(j)) % 64);
      const bool masked = rng() % 2 == 0;
      c.ids.push_back(masked ? 499 : c.labels.back());
      c.weights.push_back(masked ? 1.0f : 0.0f);
    }
  }
  double count = 0;
  for (float w : c.weights) count += w;
  for (float& w : c.weights) w = static_cast<float>(w / count);
  return c;
}

std::vector<double> train_losses(CudaModel& model, int steps, std::uint32_t data_seed) {
  std::mt19937 rng(data_seed);
  AdamWOptions adam;
  std::vector<double> losses;
  const std::int64_t batch = 4, seq = 64;  // 256 token rows: a multiple of 16
  for (int s = 0; s < steps; ++s) {
    const auto x = counting_rows(rng, batch, seq);
    losses.push_back(model.forward_backward({batch, seq, false, x.ids, x.labels, {}, x.weights}));
    model.adamw_step(adam, 3e-3, 1.0);
    model.zero_grad();
  }
  return losses;
}

struct Recipe {
  const char* name;
  Fp8Options fp8;
};
std::vector<Recipe> recipes() {
  Fp8Options delayed;
  delayed.enabled = true;  // hybrid, delayed, history 1, most_recent: Megatron's defaults
  Fp8Options history = delayed;
  history.amax_history_len = 16, history.amax_algo = Fp8Options::AmaxAlgo::kMax;
  Fp8Options tensorwise = delayed;
  tensorwise.recipe = Fp8Options::Recipe::kTensorwise;
  Fp8Options e4m3 = tensorwise;
  e4m3.format = Fp8Options::Format::kE4m3;
  Fp8Options margin = tensorwise;
  margin.margin = 2;
  return {{"delayed", delayed}, {"delayed history 16 max", history}, {"tensorwise", tensorwise},
          {"tensorwise e4m3", e4m3}, {"tensorwise margin 2", margin}};
}

// Tolerance: an FP8 GEMM's output is off by about 4% (e4m3) to 6.5% (with e5m2 gradients) of its norm at these
// widths (tests/gpu/cuda_fp8_test.cpp measures it); the loss averages ~128 masked tokens' cross-entropies, whose
// logits come from a bf16 head, so at initialisation the loss moves by well under 1%. Training on 40 steps lets
// the two runs drift apart as different rounding takes different paths: Megatron and torchao report FP8 curves
// within ~1% of bf16 at scale; a model of width 128 averages over fewer terms per output, so each step's loss is
// held to 4% of bf16's and the mean of the last ten steps to 2%, each plus a floor (0.05, 0.03) for the late steps
// whose losses are small. The task must be learned (bf16's loss drops by 40%, past the unigram's ln 64 / ln 500) for
// the comparison to mean anything, and FP8 must really run (the first losses differ).
TEST(CudaFp8Training, TinyModelFollowsItsBf16Losses) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = fp8_config(2);
  constexpr int kSteps = 40;
  auto reference = gpu_test::model_with(c, {}, 31);
  const auto want = train_losses(*reference, kSteps, 8);
  ASSERT_LT(want.back(), 0.6 * want.front()) << "bf16 did not learn the task";
  for (const auto& r : recipes()) {
    SCOPED_TRACE(r.name);
    CudaOptions o;
    o.fp8 = r.fp8;
    auto model = gpu_test::model_with(c, o, 31);
    const auto got = train_losses(*model, kSteps, 8);
    EXPECT_NE(got[0], want[0]) << "the FP8 run's forward is bf16's";
    EXPECT_NEAR(got[0], want[0], 0.01 * want[0]);
    double tail_got = 0, tail_want = 0;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_TRUE(std::isfinite(got[s])) << "step " << s;
      EXPECT_NEAR(got[s], want[s], 0.04 * want[s] + 0.05) << "step " << s;
      if (s >= kSteps - 10) tail_got += got[s], tail_want += want[s];
    }
    EXPECT_NEAR(tail_got / 10, tail_want / 10, 0.02 * tail_want / 10 + 0.03);
    std::printf("[fp8 training] %s: loss %.4f -> %.4f (bf16 %.4f -> %.4f), last ten %.4f vs %.4f\n", r.name, got[0],
                got.back(), want[0], want.back(), tail_got / 10, tail_want / 10);
  }
}

// Full recomputation reruns each FP8 layer's forward with the scales its first run used (one micro-batch a step,
// no other forward in between), so with deterministic GEMMs and attention the bits are those of keeping everything.
TEST(CudaFp8Training, RecomputeGivesTheSameBits) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = fp8_config(3);
  for (const auto recipe : {Fp8Options::Recipe::kDelayed, Fp8Options::Recipe::kTensorwise}) {
    SCOPED_TRACE(recipe == Fp8Options::Recipe::kDelayed ? "delayed" : "tensorwise");
    CudaOptions o = gpu_test::deterministic_options();
    o.fp8.enabled = true, o.fp8.recipe = recipe;
    auto keep = gpu_test::model_with(c, o, 5), recompute = gpu_test::model_with(c, o, 5);
    recompute->set_recompute_layers(true);
    std::mt19937 rng(6);
    AdamWOptions adam;
    for (int step = 0; step < 3; ++step) {
      const auto x = counting_rows(rng, 2, 64);
      const CudaBatch b{2, 64, false, x.ids, x.labels, {}, x.weights};
      EXPECT_EQ(recompute->forward_backward(b), keep->forward_backward(b)) << "step " << step;
      for (const auto& t : keep->tensors())
        EXPECT_EQ(keep->export_gradient(t.name), recompute->export_gradient(t.name)) << "step " << step << " " << t.name;
      EXPECT_EQ(recompute->adamw_step(adam, 1e-3, 1.0), keep->adamw_step(adam, 1e-3, 1.0)) << "step " << step;
      keep->zero_grad(), recompute->zero_grad();
    }
  }
}

// --first-last-layers-bf16: with every layer kept in bf16 (one at the start, one at the end of two) the FP8 model is
// the bf16 model, bit for bit; with none kept it is not.
TEST(CudaFp8Training, LayersKeptInBf16RunBf16) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = fp8_config(2);
  auto bf16 = gpu_test::deterministic_model(c, 12);
  CudaOptions o = gpu_test::deterministic_options();
  o.fp8.enabled = true, o.fp8.recipe = Fp8Options::Recipe::kTensorwise, o.fp8.first_last_layers_bf16 = true;
  auto all_kept = gpu_test::model_with(c, o, 12);
  o.fp8.layers_at_start_in_bf16 = 0, o.fp8.layers_at_end_in_bf16 = 0;
  auto none_kept = gpu_test::model_with(c, o, 12);
  std::mt19937 rng(2);
  const auto x = counting_rows(rng, 2, 64);
  const CudaBatch b{2, 64, false, x.ids, x.labels, {}, x.weights};
  const double want = bf16->forward_backward(b);
  EXPECT_EQ(all_kept->forward_backward(b), want);
  EXPECT_NE(none_kept->forward_backward(b), want);
}

}  // namespace
}  // namespace dlm::train
