// Full activation recomputation (CudaModel::set_recompute_layers) against keeping every activation: the
// backward reruns each layer's forward with the same kernels on the same inputs, so with deterministic attention
// the loss and every gradient are the same bits, for one micro-batch, for two in flight at once (the pipeline
// schedules' slots, whose layers share one recomputed layer's buffers), and across AdamW steps; the activations
// shrink by what the memory plan (cuda_memory_plan.h) says.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/cuda_memory_plan.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/optimizer.h"
#include "gpu_test_util.h"

namespace dlm::train {
namespace {

ckpt::ModelConfig recompute_config() {
  auto c = gpu_test::small_config();
  c.num_layers = 3;
  return c;
}

std::unique_ptr<CudaModel> deterministic_model(const ckpt::ModelConfig& c, bool recompute) {
  auto m = gpu_test::deterministic_model(c, 21);
  m->set_recompute_layers(recompute);
  return m;
}

using Columns = gpu_test::MaskedColumns;
Columns random_columns(std::mt19937& rng, std::int64_t n) {
  return gpu_test::masked_columns(rng, n, 0, 498, 499, 0.01f);
}

void expect_same_gradients(CudaModel& a, CudaModel& b, const char* when) {
  for (const auto& t : a.tensors())
    EXPECT_EQ(a.export_gradient(t.name), b.export_gradient(t.name)) << when << ": " << t.name;
}

TEST(CudaRecompute, GradientsAreTheSameBitsAsKeepingEveryActivation) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = recompute_config();
  auto keep = deterministic_model(c, false), recompute = deterministic_model(c, true);
  ASSERT_FALSE(keep->recompute_layers());
  ASSERT_TRUE(recompute->recompute_layers());
  const std::int64_t batch = 2, seq = 96, n = batch * seq;
  std::mt19937 rng(4);
  AdamWOptions adam;
  for (int step = 0; step < 3; ++step) {
    const Columns x = random_columns(rng, n);
    const CudaBatch b{batch, seq, step == 1, x.ids, x.labels, {}, x.weights};  // step 1: causal
    const double want = keep->forward_backward(b), got = recompute->forward_backward(b);
    EXPECT_GT(want, 0.0);
    EXPECT_EQ(got, want) << "step " << step;
    expect_same_gradients(*keep, *recompute, "after a micro-batch");
    EXPECT_EQ(recompute->adamw_step(adam, 1e-3, 1.0), keep->adamw_step(adam, 1e-3, 1.0)) << "step " << step;
    keep->zero_grad(), recompute->zero_grad();
  }
  for (const auto& t : keep->tensors())
    EXPECT_EQ(keep->export_parameter(t.name), recompute->export_parameter(t.name)) << t.name;
  // The stored activations: one layer input a layer instead of every activation, plus one layer's worth shared.
  const auto full = cuda_activation_bytes(c, n, 1, false, true, true, false);
  const auto lean = cuda_activation_bytes(c, n, 1, false, true, true, true);
  const double saved = c.num_layers * (full.per_layer_slot - lean.per_layer_slot) - (lean.shared - full.shared);
  EXPECT_GT(saved, 0.0);
  EXPECT_EQ(static_cast<double>(keep->device_bytes()) - static_cast<double>(recompute->device_bytes()), saved);
}

// Two micro-batches in flight (slots 0 and 1: both forwards, then both backwards, as 1F1B's warm-up runs them):
// each slot keeps its own layer inputs; the recomputation's shared buffers are refilled per backward.
TEST(CudaRecompute, SlotsInFlightKeepTheirOwnInputs) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = recompute_config();
  auto keep = deterministic_model(c, false), recompute = deterministic_model(c, true);
  const std::int64_t batch = 2, seq = 64, n = batch * seq;
  std::mt19937 rng(8);
  const Columns x0 = random_columns(rng, n), x1 = random_columns(rng, n);
  const CudaBatch b0{batch, seq, false, x0.ids, x0.labels, {}, x0.weights};
  const CudaBatch b1{batch, seq, false, x1.ids, x1.labels, {}, x1.weights};
  const double loss[2] = {gpu_test::two_micro_batches_in_flight(*keep, b0, b1),
                          gpu_test::two_micro_batches_in_flight(*recompute, b0, b1)};
  EXPECT_GT(loss[0], 0.0);
  EXPECT_EQ(loss[1], loss[0]);
  expect_same_gradients(*keep, *recompute, "two slots");
}

// Switching between steps frees the activations and keeps the weights; the sampling forward runs either way.
TEST(CudaRecompute, SwitchesBetweenSteps) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = recompute_config();
  auto keep = deterministic_model(c, false), model = deterministic_model(c, false);
  const std::int64_t batch = 2, seq = 64, n = batch * seq;
  std::mt19937 rng(12);
  const Columns x = random_columns(rng, n);
  const CudaBatch b{batch, seq, false, x.ids, x.labels, {}, x.weights};
  for (bool recompute : {true, false, true}) {
    model->set_recompute_layers(recompute);
    EXPECT_EQ(model->forward_backward(b), keep->forward_backward(b)) << recompute;
    expect_same_gradients(*keep, *model, recompute ? "recomputing" : "keeping");
    keep->zero_grad(), model->zero_grad();
    std::vector<std::int32_t> tokens[2];
    std::vector<float> confidence[2];
    keep->greedy_tokens(batch, seq, false, x.ids, {}, tokens[0], confidence[0]);
    model->greedy_tokens(batch, seq, false, x.ids, {}, tokens[1], confidence[1]);
    EXPECT_EQ(tokens[1], tokens[0]) << recompute;
  }
}

}  // namespace
}  // namespace dlm::train
