// CudaModel (bf16 activations, fp32 master weights) against Model on the fp32 CPU backend with the same
// weights and micro-batch: the loss within 1e-2 relative, every gradient tensor's cosine >= 0.999, for
// the diffusion objective (bidirectional) and the AR one (causal), with the default options, the
// deterministic mode and the own attention kernels (CudaOptions); and 100 AdamW steps whose loss curves
// agree within bf16 noise.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/backend.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/model.h"
#include "dlm/train/objective.h"
#include "dlm/train/optimizer.h"
#include "gpu_test_util.h"

namespace dlm::train {
namespace {

using gpu_test::small_config;

ModelBatch batch_for(const ObjectiveOptions& o, std::int64_t batch, std::int64_t seq, std::uint64_t step) {
  SampleBatch s;
  s.batch = batch, s.seq = seq;
  std::mt19937 rng(static_cast<unsigned>(step));
  // A learnable stream: each row counts up from a random start, so the loss can fall in 100 steps.
  for (std::int64_t b = 0; b < batch; ++b) {
    const int start = static_cast<int>(rng() % 400);
    for (std::int64_t j = 0; j <= seq; ++j) {
      const int tok = (start + static_cast<int>(j) * 3) % 499;
      if (j < seq) s.tokens.push_back(tok);
      if (j > 0) s.labels.push_back(tok);
    }
    s.sample_index.push_back(step * batch + static_cast<std::uint64_t>(b));
  }
  s.loss_mask.assign(s.tokens.size(), 1.0f);
  return make_model_batch(o, s, {static_cast<std::int64_t>(step), 1, 0, true});
}

struct Pair {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  Model model;
  CudaModel gpu;
  explicit Pair(const ckpt::ModelConfig& c, const CudaOptions& options = {})
      : model(c, *cpu), gpu(c, CudaShard{}, options) {
    model.init(11);
    for (const auto& p : model.parameters()) gpu.import_parameter(p.spec.name, model.export_parameter(p.spec.name));
  }
  double cpu_loss(const ModelBatch& b) {
    return gpu_test::cpu_forward_backward(model, {b.batch, b.seq, b.causal, b.input_ids, b.labels, b.position_ids,
                                                  b.weights});
  }
  double gpu_loss(const ModelBatch& b) {
    return gpu.forward_backward({b.batch, b.seq, b.causal, b.input_ids, b.labels, b.position_ids, b.weights});
  }
};

// Compares one step on both backends.
void check_batch(const ckpt::ModelConfig& c, ModelBatch b, const std::string& what, const CudaOptions& options = {}) {
  Pair pair(c, options);
  const double want = pair.cpu_loss(b), got = pair.gpu_loss(b);
  EXPECT_NEAR(got, want, 1e-2 * std::abs(want)) << what;
  std::string worst_name;
  const double worst = gpu_test::expect_gradients_match(pair.model, pair.gpu, what, worst_name);
  std::printf("[parity] %s: loss cpu %.6f gpu %.6f, worst cosine %.6f (%s)\n", what.c_str(), want, got, worst,
              worst_name.c_str());
}

// One step of each objective under each of gpu_test::step_options() (Options/CudaParityStep.*/<name>).
class CudaParityStep : public ::testing::TestWithParam<gpu_test::NamedOptions> {
 protected:
  void check_step(ObjectiveKind kind) {
    if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
    ObjectiveOptions o;
    o.kind = kind, o.mask_token = 499, o.varilen_prob = 0;
    check_batch(small_config(), batch_for(o, 3, 100, 1),
                std::string(objective_kind_name(kind)) + " (" + GetParam().name + ")", GetParam().options);
  }
};

TEST_P(CudaParityStep, DiffusionMatchesCpuBackend) { check_step(ObjectiveKind::kDiffusion); }
TEST_P(CudaParityStep, CausalMatchesCpuBackend) { check_step(ObjectiveKind::kAutoregressive); }
INSTANTIATE_TEST_SUITE_P(Options, CudaParityStep, ::testing::ValuesIn(gpu_test::step_options()),
                         [](const ::testing::TestParamInfo<gpu_test::NamedOptions>& info) {
                           return std::string(info.param.name);
                         });

// The attention mask alone flipped on each objective's batch, and a one-layer model: where a mismatch
// appears tells which part disagrees.
TEST(CudaParity, AttentionKindSwapped) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  ObjectiveOptions o;
  o.mask_token = 499, o.varilen_prob = 0;
  ModelBatch d = batch_for(o, 3, 100, 1);
  d.causal = true;
  check_batch(small_config(), d, "diffusion batch, causal attention");
  o.kind = ObjectiveKind::kAutoregressive;
  ModelBatch a = batch_for(o, 3, 100, 1);
  a.causal = false;
  check_batch(small_config(), a, "autoregressive batch, bidirectional attention");
  auto one = small_config();
  one.num_layers = 1;
  check_batch(one, batch_for(o, 3, 100, 1), "one layer, autoregressive");
  auto wide = small_config();
  wide.kv_channels = 64, wide.num_query_groups = 4;
  check_batch(wide, batch_for(o, 2, 128, 1), "head_dim 64, MHA, seq 128, autoregressive");
}

// Forward only: logits of every position against the CPU backend's; reports the worst row, so that a
// disagreement confined to some positions (a tile edge, a causal prefix) shows where it is.
void check_logits(const ckpt::ModelConfig& c, const ModelBatch& b, const char* what) {
  Pair pair(c);
  ModelInput in{b.batch, b.seq, b.input_ids, b.position_ids, {},
                b.causal ? AttentionKind::kCausal : AttentionKind::kBidirectional, {}};
  const Tensor& t = pair.model.forward(in);
  const auto cpu_all = pair.cpu->host_f32(t);
  const auto gpu = pair.gpu.forward_logits(b.batch, b.seq, b.causal, b.input_ids, b.position_ids);
  const std::int64_t V = c.vocab_size, P = c.padded_vocab_size();
  double worst = 0;
  std::int64_t worst_row = -1;
  for (std::int64_t r = 0; r < b.batch * b.seq; ++r) {
    std::vector<float> g(gpu.begin() + r * V, gpu.begin() + (r + 1) * V);
    std::vector<double> w(cpu_all.begin() + r * P, cpu_all.begin() + r * P + V);
    const double e = gpu_test::rel_error(g, w);
    if (e > worst) worst = e, worst_row = r;
  }
  std::printf("[logits] %s: worst row %lld (batch %lld, position %lld) relative error %.5f\n", what,
              static_cast<long long>(worst_row), static_cast<long long>(worst_row / b.seq),
              static_cast<long long>(worst_row % b.seq), worst);
  EXPECT_LT(worst, 2e-2) << what;
}

TEST(CudaParity, LogitsMatchCpuBackend) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  ObjectiveOptions o;
  o.mask_token = 499, o.varilen_prob = 0;
  check_logits(small_config(), batch_for(o, 3, 100, 1), "diffusion");
  o.kind = ObjectiveKind::kAutoregressive;
  check_logits(small_config(), batch_for(o, 3, 100, 1), "autoregressive");
  ModelBatch a = batch_for(o, 3, 100, 1);
  a.causal = false;
  check_logits(small_config(), a, "autoregressive batch, bidirectional");
  auto one = small_config();
  one.num_layers = 1;
  check_logits(one, batch_for(o, 3, 100, 1), "one layer, autoregressive");
}

// 100 AdamW steps on both backends from the same weights. Single micro-batch losses are noisy and two runs
// that differ by bf16 rounding drift apart step by step, so the curves are compared as means over windows
// of 10 steps.
void check_curves(ObjectiveKind kind, double lr) {
  auto c = small_config();
  Pair pair(c);
  ObjectiveOptions o;
  o.kind = kind, o.mask_token = 499, o.varilen_prob = 0;
  AdamWOptions ao{0.9, 0.95, 1e-8, 0.1};
  AdamW host(ao);
  std::vector<double> cpu(10, 0.0), gpu(10, 0.0);
  for (int step = 0; step < 100; ++step) {
    const ModelBatch b = batch_for(o, 4, 64, 1000 + step);
    cpu[step / 10] += pair.cpu_loss(b) / 10;
    gpu[step / 10] += pair.gpu_loss(b) / 10;
    std::vector<ParamRef> refs;
    std::vector<std::span<float>> grads;
    for (auto& p : pair.model.parameters()) {
      refs.push_back({p.spec.name, pair.cpu->host_f32(p.value), pair.cpu->host_f32(p.grad), !p.spec.is_norm, {}});
      grads.push_back(refs.back().grad);
    }
    clip_grad_norm(grads, 1.0);
    host.step(refs, lr);
    pair.model.zero_grad();
    pair.gpu.adamw_step(ao, lr, 1.0);
    pair.gpu.zero_grad();
  }
  double worst = 0;
  for (std::size_t w = 0; w < cpu.size(); ++w) {
    std::printf("[curve] %s steps %zu-%zu: cpu %.5f gpu %.5f\n", objective_kind_name(kind), 10 * w, 10 * w + 9,
                cpu[w], gpu[w]);
    worst = std::max(worst, std::abs(gpu[w] - cpu[w]) / cpu[w]);
  }
  EXPECT_LT(cpu.back(), 0.9 * cpu.front()) << "the reference did not learn: the test would prove nothing";
  EXPECT_LT(worst, 3e-2) << objective_kind_name(kind);
}

TEST(CudaParity, HundredStepLossCurvesAgree) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  check_curves(ObjectiveKind::kAutoregressive, 1e-3);
  check_curves(ObjectiveKind::kDiffusion, 1e-3);
}

}  // namespace
}  // namespace dlm::train
