// CudaModel with FP8 linear layers (CudaOptions::fp8, backend/cuda/fp8_linear.h): a tiny model trained from the
// same initialisation on the same batches follows its bf16 losses, and its gradients bf16's, under each recipe and
// format, within the bounds a PyTorch emulation of the recipes sets (benchmarks/train/fp8_emulation.py); full
// recomputation gives the same bits as keeping every activation; the layer choice of --first-last-layers-bf16; and all
// of it at token counts that are not multiples of 16 (difflm-noshift's seq - 1 positions a sequence).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
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

// Batches of 4 x seq token rows (seq 64: 256, a multiple of 16; 63: 252, not one).
std::vector<double> train_losses(CudaModel& model, int steps, std::uint32_t data_seed, std::int64_t seq = 64) {
  std::mt19937 rng(data_seed);
  AdamWOptions adam;
  std::vector<double> losses;
  const std::int64_t batch = 4;
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

double tail_mean(const std::vector<double>& losses) {
  double sum = 0;
  for (std::size_t s = losses.size() - 10; s < losses.size(); ++s) sum += losses[s];
  return sum / 10;
}

// What a run of 40 steps can and cannot show (benchmarks/train/fp8_emulation.py: this model, its initial weights,
// these batches and the recipes emulated in PyTorch on the CPU, independently of dlm's kernels):
// - The first twelve steps follow bf16 closely: the emulation's FP8 losses are within 0.47% of bf16's there (data
//   seeds 8-15, every recipe below); each step is held to 1.5%.
// - The later losses do not: the task is learned through a plateau whose exit time is chaotic, and the last ten
//   steps' mean moves by up to 0.25 between two precisions of one run, fp32 against bf16 included (data seed 2:
//   bf16 2.70, fp32 2.54, hybrid 2.51, e4m3 2.46), and by up to 0.56 between FP8 and bf16 (data seed 3: bf16 2.38,
//   e4m3 2.94, hybrid 2.64), with no sign that e5m2 gradients learn worse than e4m3 ones. So each run only has to
//   learn (its tail below 65% of its first loss: past the unigram plateau, ln 64 of ln 500), and the tails are
//   compared as a mean over kRuns data seeds, which holds that noise to about 0.07: within 8% of bf16's, plus 0.03
//   (~0.26). The emulation's means over seeds 8-15 differ from bf16's by -0.061 (delayed), -0.061 (history 16),
//   -0.001 (hybrid tensorwise), +0.002 (e4m3 tensorwise) and -0.015 (margin 2), single runs by up to 0.39.
// The sharp check of the gradient path is GradientsFollowBf16 below.
TEST(CudaFp8Training, TinyModelFollowsItsBf16Losses) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = fp8_config(2);
  constexpr int kSteps = 40, kEarly = 12, kRuns = 8;
  const auto run = [&](const CudaOptions& o, int r) {
    auto model = gpu_test::model_with(c, o, 31);
    return train_losses(*model, kSteps, static_cast<std::uint32_t>(8 + r));
  };
  std::vector<std::vector<double>> want;
  double tail_want = 0;
  for (int r = 0; r < kRuns; ++r) {
    want.push_back(run({}, r));
    tail_want += tail_mean(want.back()) / kRuns;
    ASSERT_LT(tail_mean(want.back()), 0.65 * want.back().front()) << "bf16 did not learn the task, data seed " << 8 + r;
  }
  for (const auto& recipe : recipes()) {
    SCOPED_TRACE(recipe.name);
    CudaOptions o;
    o.fp8 = recipe.fp8;
    double tail_got = 0;
    for (int r = 0; r < kRuns; ++r) {
      SCOPED_TRACE(::testing::Message() << "data seed " << 8 + r);
      const auto got = run(o, r);
      const auto& w = want[static_cast<std::size_t>(r)];
      EXPECT_NE(got[0], w[0]) << "the FP8 run's forward is bf16's";
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_TRUE(std::isfinite(got[s])) << "step " << s;
        if (s < kEarly) EXPECT_NEAR(got[s], w[s], 0.015 * w[s]) << "step " << s;
      }
      EXPECT_LT(tail_mean(got), 0.65 * got.front()) << "the FP8 run did not learn the task";
      tail_got += tail_mean(got) / kRuns;
    }
    EXPECT_NEAR(tail_got, tail_want, 0.08 * tail_want + 0.03);
    std::printf("[fp8 training] %s: mean over %d runs of the last ten losses %.4f (bf16 %.4f, %+.2f%%)\n",
                recipe.name, kRuns, tail_got, tail_want, 100 * (tail_got / tail_want - 1));
  }
}

// One micro-batch at the initial weights: every gradient of the FP8 model against the bf16 model's, as a relative
// L2 error. The emulation (fp8_emulation.py --gradients 3 --data-seeds 8) puts the worst tensor's (QK-norm's
// weights) at 0.124-0.129 under every recipe, hybrid tensorwise's at 0.98x e4m3 tensorwise's (over data seeds 1 and
// 8 and the linear weights alone: 0.10-0.16, 1.13x): the bound is 0.25, and hybrid tensorwise's worst error is held
// to 1.35x e4m3's. A wrong scale_inv, a misread format, an amax of
// the wrong tensor or a transposed operand gives errors far beyond (dY dequantized with X's scale_inv: 7.6e5).
// Delayed recipes run the batch three times first, so the amax history holds its amaxes.
TEST(CudaFp8Training, GradientsFollowBf16) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = fp8_config(2);
  std::mt19937 rng(8);
  const auto x = counting_rows(rng, 4, 64);
  const CudaBatch b{4, 64, false, x.ids, x.labels, {}, x.weights};
  auto reference = gpu_test::model_with(c, {}, 31);
  reference->forward_backward(b);
  std::map<std::string, double> worst_of;
  for (const auto& recipe : recipes()) {
    SCOPED_TRACE(recipe.name);
    CudaOptions o;
    o.fp8 = recipe.fp8;
    auto model = gpu_test::model_with(c, o, 31);
    for (int pass = 0; pass < 4; ++pass) {
      model->zero_grad();
      model->forward_backward(b);
    }
    double worst = 0;
    std::string worst_name;
    for (const auto& t : model->tensors()) {
      const auto got = model->export_gradient(t.name), want = reference->export_gradient(t.name);
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < want.size(); ++i)
        diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]), norm += double{want[i]} * want[i];
      if (norm == 0) continue;
      const double err = std::sqrt(diff / norm);
      EXPECT_LT(err, 0.25) << t.name;
      if (err > worst) worst = err, worst_name = t.name;
    }
    worst_of[recipe.name] = worst;
    std::printf("[fp8 gradients] %s: worst relative error %.4f (%s)\n", recipe.name, worst, worst_name.c_str());
  }
  EXPECT_LT(worst_of.at("tensorwise"), 1.35 * worst_of.at("tensorwise e4m3")) << "e5m2 gradients are noisier than "
                                                                                 "the format explains";
}

// A token count that is not a multiple of 16 (4 x 63 = 252 rows, as difflm-noshift feeds seq - 1 positions) runs in
// FP8 (the weight gradients' K padded to 256 with zeros, fp8_linear.h), not silently in bf16: the losses differ from
// bf16's from the first step and follow them within TinyModelFollowsItsBf16Losses' bound on its early steps, which
// these steps are (252 rows of the same task); the gradients within GradientsFollowBf16's. A micro-batch of 5 rows
// (padded to 16, more than its h buffer's rows: the layout gives it 8) trains too.
TEST(CudaFp8Training, AnyTokenCountRunsInFp8) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = fp8_config(2);
  constexpr int kSteps = 12;
  for (const auto& recipe : recipes()) {
    SCOPED_TRACE(recipe.name);
    CudaOptions o;
    o.fp8 = recipe.fp8;
    for (const std::uint32_t data_seed : {8u, 9u}) {
      SCOPED_TRACE(::testing::Message() << "data seed " << data_seed);
      auto bf16 = gpu_test::model_with(c, {}, 31), fp8 = gpu_test::model_with(c, o, 31);
      const auto want = train_losses(*bf16, kSteps, data_seed, 63), got = train_losses(*fp8, kSteps, data_seed, 63);
      EXPECT_NE(got[0], want[0]) << "the FP8 run at 252 rows gave bf16's loss: its GEMMs ran in bf16";
      for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(got[s], want[s], 0.015 * want[s]) << "step " << s;
    }
    std::mt19937 rng(8);
    const auto x = counting_rows(rng, 4, 63);
    const CudaBatch b{4, 63, false, x.ids, x.labels, {}, x.weights};
    auto reference = gpu_test::model_with(c, {}, 31), model = gpu_test::model_with(c, o, 31);
    reference->forward_backward(b);
    for (int pass = 0; pass < 4; ++pass) model->zero_grad(), model->forward_backward(b);  // delayed: the history
    for (const auto& t : model->tensors()) {
      const auto got = model->export_gradient(t.name), want = reference->export_gradient(t.name);
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < want.size(); ++i)
        diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]), norm += double{want[i]} * want[i];
      if (norm > 0) EXPECT_LT(std::sqrt(diff / norm), 0.25) << t.name;
    }
    auto tiny = counting_rows(rng, 1, 5);  // every position masked: the loss on all 5 rows
    tiny.ids.assign(5, 499), tiny.weights.assign(5, 0.2f);
    const CudaBatch five{1, 5, false, tiny.ids, tiny.labels, {}, tiny.weights};
    const double loss_bf16 = reference->forward_backward(five), loss = model->forward_backward(five);
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_NEAR(loss, loss_bf16, 0.05 * loss_bf16) << "5 rows";
  }
}

// Full recomputation reruns each FP8 layer's forward with the scales its first run used (one micro-batch a step,
// no other forward in between), so with deterministic GEMMs and attention the bits are those of keeping everything;
// at 2 x 64 rows and at 2 x 63 (fc2's kept x^T padded).
TEST(CudaFp8Training, RecomputeGivesTheSameBits) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = fp8_config(3);
  for (const std::int64_t seq : {64, 63})
    for (const auto recipe : {Fp8Options::Recipe::kDelayed, Fp8Options::Recipe::kTensorwise}) {
      SCOPED_TRACE(::testing::Message() << (recipe == Fp8Options::Recipe::kDelayed ? "delayed" : "tensorwise")
                                        << ", seq " << seq);
      CudaOptions o = gpu_test::deterministic_options();
      o.fp8.enabled = true, o.fp8.recipe = recipe;
      auto keep = gpu_test::model_with(c, o, 5), recompute = gpu_test::model_with(c, o, 5);
      recompute->set_recompute_layers(true);
      std::mt19937 rng(6);
      AdamWOptions adam;
      for (int step = 0; step < 3; ++step) {
        const auto x = counting_rows(rng, 2, seq);
        const CudaBatch b{2, seq, false, x.ids, x.labels, {}, x.weights};
        EXPECT_EQ(recompute->forward_backward(b), keep->forward_backward(b)) << "step " << step;
        for (const auto& t : keep->tensors())
          EXPECT_EQ(keep->export_gradient(t.name), recompute->export_gradient(t.name))
              << "step " << step << " " << t.name;
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
