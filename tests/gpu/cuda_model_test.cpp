// CudaModel beside the CPU Model and itself: init(seed) draws Model::init's weights, and the sampling
// path's greedy tokens (captured as a CUDA graph after the first call of a shape, then replayed on new
// inputs) are the argmax of the very logits forward_logits returns (an eager run), call after call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/common/error.h"
#include "backend/cuda/kernels.h"
#include "dlm/train/backend.h"
#include "dlm/train/cuda_memory_plan.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/model.h"
#include "gpu_test_util.h"

namespace dlm::train {
namespace {

using gpu_test::small_config;

// n token ids drawn uniformly below `vocab` (the same draws, in order, as the tests made inline).
std::vector<std::int32_t> random_tokens(std::mt19937& rng, std::int64_t n, std::uint32_t vocab) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& t : ids) t = static_cast<std::int32_t>(rng() % vocab);
  return ids;
}

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
    const auto ids = random_tokens(rng, n, 500);
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
    const auto ids = random_tokens(rng, n, 500);
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

// Every gradient tensor of `gpu` against the CPU reference's (cosine >= 0.999, the parity test's bound).
void expect_gradients_near(CudaModel& gpu, const gpu_test::CpuReference& cpu, const std::string& what) {
  for (const auto& t : gpu.tensors())
    EXPECT_GE(gpu_test::cosine(gpu.export_gradient(t.name), cpu.model.export_gradient(t.name)), 0.999)
        << what << " " << t.name;
}

// sum_i weights_i * CE_i in double from the logits of every row (forward_logits: the head on every row, never
// packed).
double loss_from_logits(CudaModel& gpu, const CudaBatch& b) {
  const auto logits = gpu.forward_logits(b.batch, b.seq, b.causal, b.ids, b.positions);
  const std::int64_t V = gpu.config().vocab_size;
  double loss = 0;
  for (std::size_t i = 0; i < b.weights.size(); ++i) {
    if (b.weights[i] == 0) continue;
    const float* row = logits.data() + static_cast<std::int64_t>(i) * V;
    double most = row[0], sum = 0;
    for (std::int64_t v = 1; v < V; ++v) most = std::max(most, double{row[v]});
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - most);
    loss += double{b.weights[i]} * (most + std::log(sum) - row[b.labels[i]]);
  }
  return loss;
}

// The output layer runs on the rows with loss weight only, packed (the diffusion objective weights about half
// of them). With most rows weighted at a vocabulary whose packed logits come in two chunks, and with 3 rows
// (padded to one quantum), the loss is the one the logits of every row give; with no row weighted the loss and
// every gradient are exactly zero. The gradients of the same weightings on a small vocabulary are the CPU
// backend's.
TEST(CudaModel, HeadOnWeightedRowsMatchesTheReferences) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto weigh = [](std::mt19937& rng, std::int64_t n, int weighted) {
    std::vector<float> weights(static_cast<std::size_t>(n), 0.0f);
    if (weighted < 0)  // about 3 rows in 4
      for (auto& w : weights) w = rng() % 4 != 0 ? 1.0f / 6144 : 0.0f;
    for (int k = 0; k < weighted; ++k) weights[static_cast<std::size_t>(rng() % n)] = 0.25f;
    return weights;
  };
  {
    auto c = small_config();
    c.num_layers = 1, c.vocab_size = 151936, c.mask_token_id = 151935, c.max_position_embeddings = 4096;
    CudaModel packed(c);
    packed.init(5);
    const std::int64_t batch = 2, seq = 4096, n = batch * seq;
    std::mt19937 rng(3);
    const auto ids = random_tokens(rng, n, 151936), labels = random_tokens(rng, n, 151936);
    for (int weighted : {-1, 3, 0}) {
      const std::vector<float> weights = weigh(rng, n, weighted);
      const CudaBatch b{batch, seq, false, ids, labels, {}, weights};
      packed.zero_grad();
      const double got = packed.forward_backward(b);
      if (weighted == 0) {
        EXPECT_EQ(got, 0.0);
        for (const auto& t : packed.tensors())
          for (float g : packed.export_gradient(t.name)) ASSERT_EQ(g, 0.0f) << t.name;
        continue;
      }
      const double want = loss_from_logits(packed, b);
      EXPECT_GT(want, 0.0);
      EXPECT_NEAR(got, want, 1e-5 * want) << weighted;
      EXPECT_NEAR(packed.forward_loss(b), want, 1e-5 * want) << weighted;
    }
  }
  auto c = small_config();
  c.num_layers = 1, c.max_position_embeddings = 512;
  CudaModel packed(c);
  packed.init(5);
  const std::int64_t batch = 2, seq = 512, n = batch * seq;
  std::mt19937 rng(4);
  const auto ids = random_tokens(rng, n, 500), labels = random_tokens(rng, n, 500);
  for (int weighted : {-1, 3}) {
    const std::vector<float> weights = weigh(rng, n, weighted);
    const CudaBatch b{batch, seq, false, ids, labels, {}, weights};
    gpu_test::CpuReference cpu(packed);
    packed.zero_grad();
    const double got = packed.forward_backward(b), want = cpu.forward_backward(b);
    EXPECT_GT(want, 0.0);
    EXPECT_NEAR(got, want, 1e-2 * want) << weighted;
    expect_gradients_near(packed, cpu, std::to_string(weighted));
  }
}

// The last layer's MLP runs on the loss rows only (packed, as the head). The loss and gradients are the CPU
// backend's, for two micro-batches in flight (the stage calls' slots: the packed rows live in each slot's
// buffers), and so is the loss-only forward.
TEST(CudaModel, LastLayerOnTheLossRowsMatchesTheCpuBackend) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  auto c = small_config();
  c.num_layers = 3;
  CudaModel packed(c);
  packed.init(6);
  gpu_test::CpuReference cpu(packed);
  const std::int64_t batch = 2, seq = 128, n = batch * seq;
  std::mt19937 rng(13);
  std::vector<std::vector<std::int32_t>> ids, labels;
  std::vector<std::vector<float>> weights;
  for (int k = 0; k < 2; ++k) {
    ids.push_back(random_tokens(rng, n, 500)), labels.push_back(random_tokens(rng, n, 500));
    weights.emplace_back(n, 0.0f);
    for (auto& w : weights.back()) w = rng() % 3 == 0 ? 0.02f : 0.0f;  // about a third: the head packs them
  }
  const CudaBatch b0{batch, seq, false, ids[0], labels[0], {}, weights[0]};
  const CudaBatch b1{batch, seq, true, ids[1], labels[1], {}, weights[1]};
  const double got = gpu_test::two_micro_batches_in_flight(packed, b0, b1);
  const double want = cpu.forward_backward(b0) + cpu.forward_backward(b1);
  EXPECT_GT(want, 0.0);
  EXPECT_NEAR(got, want, 1e-2 * want);
  expect_gradients_near(packed, cpu, "two in flight");
  const double want1 = cpu.forward_backward(b1);
  EXPECT_NEAR(packed.forward_loss(b1), want1, 1e-2 * want1);
}

// zero_grad() clears the norms and the embedding but leaves the weight GEMMs' gradients to be overwritten by
// their next GEMM (beta 0): read before that they are zeros, and two micro-batches after it sum exactly as two
// micro-batches after construction (deterministic attention: the same kernels in the same order).
TEST(CudaModel, ZeroGradLetsTheNextBackwardOverwrite) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = small_config();
  const auto gpu = gpu_test::deterministic_model(c, 3);
  const std::int64_t batch = 2, seq = 64, n = batch * seq;
  std::mt19937 rng(5);
  auto make = [&](std::vector<std::int32_t>& ids, std::vector<std::int32_t>& labels, std::vector<float>& weights) {
    ids = random_tokens(rng, n, 500), labels = random_tokens(rng, n, 500), weights.assign(n, 0.0f);
    for (auto& w : weights) w = rng() % 2 ? 0.01f : 0.0f;
  };
  std::vector<std::int32_t> ids1, labels1, ids2, labels2;
  std::vector<float> w1, w2;
  make(ids1, labels1, w1), make(ids2, labels2, w2);
  const CudaBatch b1{batch, seq, false, ids1, labels1, {}, w1}, b2{batch, seq, false, ids2, labels2, {}, w2};
  gpu->forward_backward(b1), gpu->forward_backward(b2);
  std::vector<std::vector<float>> first;
  for (const auto& t : gpu->tensors()) first.push_back(gpu->export_gradient(t.name));
  gpu->zero_grad();
  for (const auto& t : gpu->tensors())
    for (float g : gpu->export_gradient(t.name)) ASSERT_EQ(g, 0.0f) << t.name;
  gpu->forward_backward(b1), gpu->forward_backward(b2);
  for (std::size_t i = 0; i < gpu->tensors().size(); ++i) {
    const auto again = gpu->export_gradient(gpu->tensors()[i].name);
    ASSERT_EQ(again.size(), first[i].size());
    for (std::size_t e = 0; e < again.size(); ++e)
      ASSERT_EQ(again[e], first[i][e]) << gpu->tensors()[i].name << " " << e;
  }
  // A norm taken straight after zero_grad sees zeros, not the last step's gradients.
  gpu->zero_grad();
  EXPECT_EQ(gpu->grad_norm(), 0.0);
}

// The activations CudaModel allocates are the buffers of cuda_activation_layout, the layout the dry run's plan sums:
// an upload adds the shared buffers (with the norms' partial sums, whose size depends on the device, and the
// one-double loss total) and one micro-batch's input columns; reserving slots adds a layer's activations per layer
// and slot; the head inputs of a second slot come with its first forward.
TEST(CudaModel, AllocatesTheActivationLayout) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  auto c = small_config();
  c.num_layers = 3;
  const auto model = gpu_test::model_with(c, {}, 1);
  CudaModel& gpu = *model;
  const std::int64_t batch = 2, seq = 96, n = batch * seq;
  std::mt19937 rng(7);
  const auto ids = random_tokens(rng, n, 500), labels = random_tokens(rng, n, 500);
  const std::vector<float> weights(static_cast<std::size_t>(n), 0.01f);
  const CudaBatch b{batch, seq, false, ids, labels, {}, weights};
  const CudaActivationLayout layout = cuda_activation_layout(c, n, 1, false, true, true);
  const auto bytes = [&] { return static_cast<std::int64_t>(gpu.device_bytes()); };
  const std::int64_t at_rest = bytes();
  gpu.upload_inputs(0, b);
  const cuda::QkvShape qs{static_cast<int>(n), c.num_attention_heads, c.num_query_groups, c.kv_channels,
                          c.qk_layernorm, 0};
  const std::int64_t partial =
      std::max(cuda::rmsnorm_partial_floats(static_cast<int>(n), c.hidden_size), cuda::qk_norm_partial_floats(qs));
  EXPECT_EQ(bytes() - at_rest, layout.shared.bytes() + partial * 4 + 8 + layout.inputs.bytes());
  const std::int64_t uploaded = bytes();
  gpu.reserve_slots(2);
  EXPECT_EQ(bytes() - uploaded, 2 * c.num_layers * (layout.layer.input_bytes() + layout.layer.rest_bytes()));
  gpu.forward_stage(0, 0, false);  // builds the attention's plans for the shape (its workspace)
  const std::int64_t one_slot = bytes();
  gpu.forward_stage(0, 1, false);
  EXPECT_EQ(bytes() - one_slot, layout.head.bytes());
  EXPECT_GT(gpu.take_loss(), 0.0);
}

}  // namespace
}  // namespace dlm::train
