// CudaModel (bf16 activations, fp32 master weights) against Model on the fp32 CPU backend with the same
// weights and micro-batch: the loss within 1e-2 relative, every gradient tensor's cosine >= 0.999, for
// the diffusion objective (bidirectional) and the AR one (causal); and 100 AdamW steps whose loss curves
// agree within bf16 noise.
#include <gtest/gtest.h>

#include <random>
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

ckpt::ModelConfig small_config() {
  ckpt::ModelConfig c;
  c.num_layers = 2, c.hidden_size = 128, c.ffn_hidden_size = 344, c.num_attention_heads = 4;
  c.num_query_groups = 2, c.kv_channels = 32, c.vocab_size = 500, c.max_position_embeddings = 128;
  c.qk_layernorm = true, c.mask_token_id = 499;
  return c;
}

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
  explicit Pair(const ckpt::ModelConfig& c) : model(c, *cpu), gpu(c) {
    model.init(11);
    for (const auto& p : model.parameters()) gpu.import_parameter(p.spec.name, model.export_parameter(p.spec.name));
  }
  double cpu_loss(const ModelBatch& b) {
    ModelInput in{b.batch, b.seq, b.input_ids, b.position_ids, {},
                  b.causal ? AttentionKind::kCausal : AttentionKind::kBidirectional};
    model.forward(in);
    auto ce = model.cross_entropy(b.labels);
    double loss = 0;
    for (std::size_t i = 0; i < ce.size(); ++i) loss += double{b.weights[i]} * ce[i];
    model.backward(b.weights);
    return loss;
  }
  double gpu_loss(const ModelBatch& b) {
    return gpu.forward_backward({b.batch, b.seq, b.causal, b.input_ids, b.labels, b.position_ids, b.weights});
  }
};

void check_step(ObjectiveKind kind) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  auto c = small_config();
  Pair pair(c);
  ObjectiveOptions o;
  o.kind = kind, o.mask_token = 499, o.varilen_prob = 0;
  const ModelBatch b = batch_for(o, 3, 100, 1);
  const double want = pair.cpu_loss(b), got = pair.gpu_loss(b);
  EXPECT_NEAR(got, want, 1e-2 * std::abs(want)) << objective_kind_name(kind);
  for (const auto& p : pair.model.parameters()) {
    const auto g = pair.gpu.export_gradient(p.spec.name), w = pair.model.export_gradient(p.spec.name);
    EXPECT_GE(gpu_test::cosine(g, w), 0.999) << p.spec.name;
  }
}

TEST(CudaParity, DiffusionStepMatchesCpuBackend) { check_step(ObjectiveKind::kDiffusion); }
TEST(CudaParity, CausalStepMatchesCpuBackend) { check_step(ObjectiveKind::kAutoregressive); }

TEST(CudaParity, HundredStepLossCurvesAgree) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  auto c = small_config();
  Pair pair(c);
  ObjectiveOptions o;
  o.mask_token = 499, o.varilen_prob = 0;
  AdamWOptions ao{0.9, 0.95, 1e-8, 0.1};
  AdamW host(ao);
  std::vector<double> cpu, gpu;
  for (int step = 0; step < 100; ++step) {
    const ModelBatch b = batch_for(o, 2, 64, 1000 + step);
    cpu.push_back(pair.cpu_loss(b));
    gpu.push_back(pair.gpu_loss(b));
    std::vector<ParamRef> refs;
    std::vector<std::span<float>> grads;
    for (auto& p : pair.model.parameters()) {
      refs.push_back({p.spec.name, pair.cpu->host_f32(p.value), pair.cpu->host_f32(p.grad), !p.spec.is_norm, {}});
      grads.push_back(refs.back().grad);
    }
    clip_grad_norm(grads, 1.0);
    host.step(refs, 3e-3);
    pair.model.zero_grad();
    pair.gpu.adamw_step(ao, 3e-3, 1.0);
    pair.gpu.zero_grad();
  }
  EXPECT_LT(cpu.back(), 0.7 * cpu.front()) << "the reference did not learn: the test would prove nothing";
  double worst = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) worst = std::max(worst, std::abs(gpu[i] - cpu[i]) / cpu[i]);
  // Masked-diffusion losses of one micro-batch are noisy; bf16 rounding moves them by well under 5%.
  EXPECT_LT(worst, 5e-2) << "first " << cpu.front() << " vs " << gpu.front() << ", last " << cpu.back() << " vs "
                         << gpu.back();
}

}  // namespace
}  // namespace dlm::train
