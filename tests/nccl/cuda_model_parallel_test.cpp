// CudaModel under tensor (with and without sequence parallelism) and pipeline parallelism on 2 ranks, against
// the whole model on one GPU: the same initial weights (each shard the slice of the whole model's init), the
// same micro-batches, eight AdamW steps through the trainer's calls (forward_backward_all, finish_gradients,
// grad_norm, step). Losses and gradient norms must agree within bf16 noise, and every tensor's update
// (final - initial weights) must point the same way as the whole model's.
//
// With a GPU per rank the groups are NCCL's; with one GPU for both ranks they stage through MPI
// (staged_device_group), so the layouts are tested on a one-GPU machine too. No GPU: skipped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dlm/ckpt/sharding.h"
#include "dlm/train/device.h"
#include "dlm/train/device_groups.h"
#include "dlm/train/parallel.h"
#include "mpi_test_main.h"

namespace dlm::train {
namespace {

using test::mpi_world;

int gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  int least = count;
  mpi_world().all_reduce(std::span<int>(&least, 1), ReduceOp::kMin);
  return least;
}

ckpt::ModelConfig tiny(bool tied) {
  ckpt::ModelConfig c;
  c.num_layers = 4, c.hidden_size = 128, c.ffn_hidden_size = 256, c.num_attention_heads = 4;
  c.num_query_groups = 2, c.kv_channels = 32, c.vocab_size = 500, c.max_position_embeddings = 128;
  c.qk_layernorm = true, c.mask_token_id = 499, c.tie_word_embeddings = tied;
  return c;
}

// Diffusion-shaped micro-batches: about half the positions masked and weighted, the same on every rank.
std::vector<ModelBatch> batches(int count, std::uint32_t seed) {
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
  std::vector<ParamRef> before, after;
  std::vector<std::vector<float>> before_values, after_values;
};

Run train(TrainableModel& model, const std::vector<ModelBatch>& data, int steps) {
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
    run.norms.push_back(device.grad_norm());
    device.step(AdamWOptions{}, 1e-3, 1.0);
  }
  copy(model, run.after, run.after_values);
  return run;
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  return aa == 0 && bb == 0 ? 1.0 : ab / std::sqrt(aa * bb);
}

// The slice of a whole-model tensor this rank holds.
std::vector<float> slice(const std::vector<float>& whole, const ckpt::TensorShard& shard) {
  ckpt::Tensor t = ckpt::Tensor::zeros(shard.name, shard.global_shape);
  std::copy(whole.begin(), whole.end(), t.f32().begin());
  const ckpt::Tensor local = ckpt::extract_shard(t, shard);
  const auto v = local.f32();
  return {v.begin(), v.end()};
}

void check_layout(int tp, int pp, bool sp, bool tied) {
  const int devices = gpus();
  if (devices == 0) GTEST_SKIP() << "needs a GPU";
  ASSERT_EQ(mpi_world().size(), 2);
#ifdef DLM_HAVE_NCCL
  const bool nccl = devices >= 2;
#else
  const bool nccl = false;
#endif
  ASSERT_EQ(cudaSetDevice(nccl ? launch_info_from_environment().local_rank : 0), cudaSuccess);
  const ckpt::ModelConfig config = tiny(tied);
  const auto data = batches(4, 7);
  constexpr int kSteps = 8;

  auto whole = make_cuda_trainable(config, 5);
  const Run want = train(*whole, data, kSteps);
  whole.reset();

  ProcessGroups groups = make_process_groups(mpi_world(), derive_parallel_config(2, tp, pp));
  DeviceGroups nccl_groups;
  std::unique_ptr<DeviceGroup> staged_tensor, staged_pipeline;
  CudaParallelGroups parallel{&groups, nullptr, nullptr, sp};
  if (nccl) {
    nccl_groups = make_device_groups(mpi_world(), groups.config, launch_info_from_environment().local_rank, 60.0);
    parallel.tensor = nccl_groups.tensor_group.get(), parallel.pipeline = nccl_groups.pipeline_group.get();
  } else {
    if (tp > 1) staged_tensor = staged_device_group(*groups.tensor), parallel.tensor = staged_tensor.get();
    if (pp > 1) staged_pipeline = staged_device_group(*groups.pipeline), parallel.pipeline = staged_pipeline.get();
  }
  auto model = make_cuda_trainable(config, 5, parallel);
  const Run got = train(*model, data, kSteps);

  const std::string what = fmt::format("TP{}{} PP{}{} ({})", tp, sp ? "+SP" : "", pp, tied ? " tied" : "",
                                       nccl ? "NCCL" : "staged through MPI");
  double worst_loss = 0, worst_norm = 0;
  for (int s = 0; s < kSteps; ++s) {
    worst_loss = std::max(worst_loss, std::abs(got.losses[s] - want.losses[s]) / want.losses[s]);
    worst_norm = std::max(worst_norm, std::abs(got.norms[s] - want.norms[s]) / want.norms[s]);
  }
  EXPECT_LE(worst_loss, 2e-3) << what;
  EXPECT_LE(worst_norm, 2e-2) << what;
  EXPECT_LT(got.losses.back(), got.losses.front()) << what << ": the loss did not fall";

  // Each local tensor's update against the slice of the whole model's update.
  const auto shards = ckpt::rank_shards(config, ckpt::ParallelLayout{tp, pp, 1, {}}, groups.coords.tensor,
                                        groups.coords.pipeline);
  ASSERT_EQ(shards.size(), got.after.size());
  double worst_cos = 1;
  std::string worst_name;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    std::size_t w = 0;
    while (w < want.after.size() && want.after[w].name != shards[i].name) ++w;
    ASSERT_LT(w, want.after.size()) << shards[i].name;
    const auto a0 = slice(want.before_values[w], shards[i]), a1 = slice(want.after_values[w], shards[i]);
    EXPECT_EQ(got.before_values[i], a0) << what << ": initial " << shards[i].name << " is not the whole model's slice";
    std::vector<double> du(a0.size()), dg(a0.size());
    for (std::size_t e = 0; e < a0.size(); ++e) du[e] = a1[e] - a0[e], dg[e] = got.after_values[i][e] - got.before_values[i][e];
    const double cos = cosine(dg, du);
    EXPECT_GE(cos, 0.99) << what << ": " << shards[i].name;
    if (cos < worst_cos) worst_cos = cos, worst_name = shards[i].name;
  }
  if (mpi_world().rank() == 0)
    std::printf("[gpu layouts] %s: losses %.6f..%.6f (whole %.6f..%.6f), worst loss rel %.2e, norm rel %.2e, "
                "worst update cosine %.5f (%s)\n",
                what.c_str(), got.losses.front(), got.losses.back(), want.losses.front(), want.losses.back(), worst_loss,
                worst_norm, worst_cos, worst_name.c_str());
}

TEST(CudaModelParallel, TensorParallel) { check_layout(2, 1, false, false); }
TEST(CudaModelParallel, TensorAndSequenceParallel) { check_layout(2, 1, true, false); }
TEST(CudaModelParallel, TensorParallelTiedEmbeddings) { check_layout(2, 1, true, true); }
TEST(CudaModelParallel, PipelineParallel) { check_layout(1, 2, false, false); }
TEST(CudaModelParallel, PipelineParallelTiedEmbeddings) { check_layout(1, 2, false, true); }

}  // namespace
}  // namespace dlm::train
