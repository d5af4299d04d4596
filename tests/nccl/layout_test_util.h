// What the GPU layout tests (dlm_cuda_parallel_tests) share: the tiny model, its diffusion-shaped micro-batches,
// and a run of the trainer's calls that records losses, norms, gradients and weights.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/device.h"
#include "dlm/train/model.h"
#include "dlm/train/optimizer.h"
#include "mpi_test_main.h"

namespace dlm::train::layout_test {

inline int gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  int least = count;
  test::mpi_world().all_reduce(std::span<int>(&least, 1), ReduceOp::kMin);
  return least;
}

inline ckpt::ModelConfig tiny(bool tied) {
  ckpt::ModelConfig c;
  c.num_layers = 4, c.hidden_size = 128, c.ffn_hidden_size = 256, c.num_attention_heads = 4;
  c.num_query_groups = 2, c.kv_channels = 32, c.vocab_size = 500, c.max_position_embeddings = 128;
  c.qk_layernorm = true, c.mask_token_id = 499, c.tie_word_embeddings = tied;
  return c;
}

// Diffusion-shaped micro-batches: about half the positions masked and weighted, the same on every rank.
inline std::vector<ModelBatch> batches(int count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<ModelBatch> out;
  for (int k = 0; k < count; ++k) {
    ModelBatch b;
    b.batch = 2, b.seq = 48;
    const std::size_t n = static_cast<std::size_t>(b.batch * b.seq);
    for (std::size_t i = 0; i < n; ++i) {
      const auto token = static_cast<std::int32_t>(rng() % 499);
      const bool masked = rng() % 2 == 0;
      b.labels.push_back(token);
      b.input_ids.push_back(masked ? 499 : token);
      b.weights.push_back(masked ? 1.0f / static_cast<float>(n * count) : 0.0f);
    }
    out.push_back(std::move(b));
  }
  return out;
}

struct Run {
  std::vector<double> losses, norms;
  std::vector<std::int64_t> zeros;  // DeviceTraining::grad_zeros() of each step (--log-num-zeros-in-grad)
  std::vector<ParamRef> before, after;
  std::vector<std::vector<float>> before_values, after_values;
  std::vector<std::vector<float>> first_gradients;  // per parameter (parameters() order), after the first step's
                                                    // finish_gradients
};

inline Run train(TrainableModel& model, const std::vector<ModelBatch>& data, int steps) {
  Run run;
  auto copy = [](TrainableModel& m, std::vector<ParamRef>& refs, std::vector<std::vector<float>>& values) {
    refs = m.parameters();
    for (const auto& r : refs) values.emplace_back(r.value.begin(), r.value.end());
  };
  copy(model, run.before, run.before_values);
  DeviceTraining& device = *model.device_training();
  for (int s = 0; s < steps; ++s) {
    model.zero_grad();
    run.losses.push_back(model.forward_backward_all(data));
    model.finish_gradients();
    if (s == 0)
      for (const auto& r : run.before) run.first_gradients.push_back(device.gradient(r.name));
    run.norms.push_back(device.grad_norm());
    run.zeros.push_back(device.grad_zeros());
    device.step(AdamWOptions{}, 1e-3, 1.0);
  }
  copy(model, run.after, run.after_values);
  return run;
}

inline double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  return aa == 0 && bb == 0 ? 1.0 : ab / std::sqrt(aa * bb);
}


// A layout's run against the whole model's: the losses within 2e-3, the first step's norm within 2e-2, every norm
// within 25%, and a falling loss. The first step starts from the same weights: its norm shows the layout's own
// rounding. Later steps start from weights that differ in last bits, which the bf16 residual gradient turns into
// rounding flips: a tied embedding (one tensor fed by the head and by every token's residual gradient) drifted to
// 12% in one of 8 steps with the losses still within 8e-4, so the later norms are held coarsely and the losses tightly.
struct LayoutGap {
  double loss = 0, norm = 0, first_norm = 0;  // the worst relative distances
};
inline LayoutGap distance_to(const Run& got, const Run& want) {
  LayoutGap gap;
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    gap.loss = std::max(gap.loss, std::abs(got.losses[s] - want.losses[s]) / want.losses[s]);
    gap.norm = std::max(gap.norm, std::abs(got.norms[s] - want.norms[s]) / want.norms[s]);
  }
  gap.first_norm = std::abs(got.norms[0] - want.norms[0]) / want.norms[0];
  return gap;
}
inline LayoutGap expect_layout_follows(const Run& got, const Run& want, const std::string& what) {
  const LayoutGap gap = distance_to(got, want);
  EXPECT_LE(gap.loss, 2e-3) << what;
  EXPECT_LE(gap.first_norm, 2e-2) << what;
  EXPECT_LE(gap.norm, 0.25) << what;
  EXPECT_LT(got.losses.back(), got.losses.front()) << what << ": the loss did not fall";
  return gap;
}

// Whether `values` are the same bits on every member of `group` (their max and min over it agree).
inline bool same_on_every_member(const std::vector<float>& values, Communicator& group) {
  std::vector<float> hi = values, lo = values;
  group.all_reduce(std::span<float>(hi), ReduceOp::kMax);
  group.all_reduce(std::span<float>(lo), ReduceOp::kMin);
  return hi == lo;
}

}  // namespace dlm::train::layout_test
