// The whole model: finite-difference gradients of every parameter, configuration and input errors
// before any compute, init, import/export by name, and the trainer/sampler adapters.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dlm/common/error.h"
#include "dlm/train/model.h"
#include "dlm/train/model_adapters.h"
#include "gradcheck.h"

namespace dlm::train {
namespace {

using testing::expect_parameter_gradients_match;

ckpt::ModelConfig tiny_config(bool qk_norm, bool tied, ckpt::AttentionMask mask, int groups) {
  ckpt::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 8;
  c.ffn_hidden_size = 12;
  c.num_attention_heads = 2;
  c.num_query_groups = groups;
  c.kv_channels = 4;
  c.vocab_size = 13;
  c.make_vocab_size_divisible_by = 8;  // 16 rows: 3 of padding
  c.max_position_embeddings = 16;
  c.rotary_base = 10000;
  c.norm_epsilon = 1e-6;
  c.qk_layernorm = qk_norm;
  c.tie_word_embeddings = tied;
  c.attention_mask = mask;
  c.init_method_std = 0.4;  // large enough that every nonlinearity is exercised
  return c;
}

struct Batch {
  std::vector<std::int32_t> ids = {1, 5, 12, 3, 0, 7, 7, 2, 9, 11};
  std::vector<std::int32_t> positions = {0, 1, 2, 3, 4, 3, 4, 5, 6, 15};
  std::vector<std::int32_t> labels = {4, 5, -1, 12, 0, 1, 2, 3, 8, 6};
  std::vector<float> weights = {0.3f, 1.0f, 0.7f, 0.2f, 0.5f, 0.9f, 0.1f, 0.6f, 0.4f, 0.8f};
  ModelInput input(AttentionKind kind) const { return {2, 5, ids, positions, {}, kind, {}}; }
};

double weighted_loss(Model& m, const Batch& b, AttentionKind kind) {
  m.forward(b.input(kind));
  auto ce = m.cross_entropy(b.labels);
  double s = 0;
  for (std::size_t i = 0; i < ce.size(); ++i) s += double(b.weights[i]) * ce[i];
  return s;
}

struct GradCase {
  bool qk_norm, tied;
  ckpt::AttentionMask mask;
  int groups;
};

class ModelGradients : public ::testing::TestWithParam<GradCase> {};

TEST_P(ModelGradients, EveryParameterMatchesFiniteDifferences) {
  const auto [qk, tied, mask, groups] = GetParam();
  auto be = make_cpu_backend(2);
  Model m(tiny_config(qk, tied, mask, groups), *be);
  m.init(7);
  const Batch b;
  const AttentionKind kind = m.default_attention();
  m.zero_grad();
  weighted_loss(m, b, kind);
  m.backward(b.weights);
  expect_parameter_gradients_match(m, [&] { return weighted_loss(m, b, kind); }, 1e-2f, 1e-2, true);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ModelGradients,
    ::testing::Values(GradCase{true, true, ckpt::AttentionMask::kCausal, 1},         // Qwen3-like, GQA, tied
                      GradCase{false, false, ckpt::AttentionMask::kBidirectional, 2},  // Llama-like MHA, diffusion
                      GradCase{true, false, ckpt::AttentionMask::kBidirectional, 1}));

TEST(Model, GradientsAccumulateUntilZeroed) {
  auto be = make_cpu_backend(1);
  Model m(tiny_config(true, false, ckpt::AttentionMask::kBidirectional, 1), *be);
  m.init(3);
  const Batch b;
  weighted_loss(m, b, m.default_attention());
  m.backward(b.weights);
  auto once = m.export_gradient("decoder.layers.1.mlp.linear_fc1.weight");
  weighted_loss(m, b, m.default_attention());
  m.backward(b.weights);
  auto twice = m.export_gradient("decoder.layers.1.mlp.linear_fc1.weight");
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-6f + 1e-5f * std::abs(once[i]));
  m.zero_grad();
  for (auto g : m.export_gradient("embedding.word_embeddings.weight")) EXPECT_EQ(g, 0.0f);
}

TEST(Model, BadConfigsFailBeforeAnyAllocation) {
  auto be = make_cpu_backend(1);
  auto c = tiny_config(false, false, ckpt::AttentionMask::kCausal, 1);
  c.num_attention_heads = 3;  // 8 % 3 != 0
  c.num_query_groups = 1;
  try {
    Model m(c, *be);
    FAIL() << "heads not dividing hidden accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "invalid model config: num_attention_heads 3 does not divide hidden_size 8");
  }
  c = tiny_config(false, false, ckpt::AttentionMask::kCausal, 1);
  c.num_attention_heads = 4;
  c.num_query_groups = 3;
  c.kv_channels = 2;
  try {
    Model m(c, *be);
    FAIL() << "groups not dividing heads accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_query_groups 3 does not divide num_attention_heads 4"), std::string::npos)
        << e.what();
  }
  c = tiny_config(false, false, ckpt::AttentionMask::kCausal, 1);
  c.kv_channels = 3;
  EXPECT_THROW(Model(c, *be), Error);  // RoPE needs an even head dim
}

TEST(Model, BadInputsFailBeforeCompute) {
  auto be = make_cpu_backend(1);
  Model m(tiny_config(false, false, ckpt::AttentionMask::kCausal, 1), *be);
  m.init(1);
  auto expect_error = [&](const ModelInput& in, const std::string& text) {
    try {
      m.forward(in);
      FAIL() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  std::vector<std::int32_t> long_ids(17, 1);
  expect_error({1, 17, long_ids, {}, {}, AttentionKind::kCausal, {}},
               "sequence length 17 is longer than max_position_embeddings 16");
  std::vector<std::int32_t> ids = {1, 2, 13};
  expect_error({1, 3, ids, {}, {}, AttentionKind::kCausal, {}}, "token id 13 at position 2 is outside the vocabulary of 13");
  ids = {1, 2, 3};
  std::vector<std::int32_t> pos = {0, 1, 16};
  expect_error({1, 3, ids, pos, {}, AttentionKind::kCausal, {}}, "position id 16 at position 2");
  expect_error({2, 3, ids, {}, {}, AttentionKind::kCausal, {}}, "3 ids for batch 2 x seq 3");
  EXPECT_THROW(m.cross_entropy(ids), Error);  // no forward yet
  m.forward({1, 3, ids, {}, {}, AttentionKind::kCausal, {}});
  std::vector<std::int32_t> bad_labels = {0, 13, 1};
  EXPECT_THROW(m.cross_entropy(bad_labels), Error);
  std::vector<float> w(3, 1.0f);
  EXPECT_THROW(m.backward(w), Error);  // cross_entropy() not run on this forward
}

TEST(Model, InitIsDeterministicWithMegatronStatistics) {
  auto be = make_cpu_backend(1);
  auto c = tiny_config(true, false, ckpt::AttentionMask::kCausal, 1);
  c.hidden_size = 64;
  c.init_method_std = 0.02;
  Model a(c, *be), b(c, *be);
  a.init(42);
  b.init(42);
  EXPECT_EQ(a.export_weights().at("output_layer.weight").bytes, b.export_weights().at("output_layer.weight").bytes);
  b.init(43);
  EXPECT_NE(a.export_parameter("output_layer.weight"), b.export_parameter("output_layer.weight"));
  auto w = a.export_parameter("decoder.layers.0.mlp.linear_fc1.weight");  // 24 x 64
  double s = 0, s2 = 0;
  for (auto x : w) s += x, s2 += double(x) * x;
  const double mean = s / w.size(), sd = std::sqrt(s2 / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(sd, 0.02, 0.001);
  for (auto x : a.export_parameter("decoder.layers.1.self_attention.k_layernorm.weight")) EXPECT_EQ(x, 1.0f);
  for (auto x : a.export_parameter("decoder.final_layernorm.weight")) EXPECT_EQ(x, 1.0f);
}

TEST(Model, WeightsRoundTripByGlobalNameAndRejectMismatches) {
  auto be = make_cpu_backend(1);
  const auto c = tiny_config(true, false, ckpt::AttentionMask::kCausal, 1);
  Model a(c, *be), b(c, *be);
  a.init(5);
  b.import_weights(a.export_weights());
  const Batch batch;
  a.forward(batch.input(AttentionKind::kCausal));
  b.forward(batch.input(AttentionKind::kCausal));
  EXPECT_EQ(a.cross_entropy(batch.labels), b.cross_entropy(batch.labels));
  auto weights = a.export_weights();
  EXPECT_EQ(weights.size(), ckpt::model_tensors(c).size());
  weights.erase("decoder.layers.1.self_attention.q_layernorm.weight");
  EXPECT_THROW(b.import_weights(weights), Error);
  weights = a.export_weights();
  weights.emplace("extra", ckpt::Tensor::zeros("extra", {1}));
  EXPECT_THROW(b.import_weights(weights), Error);
  EXPECT_THROW(b.parameter("nope"), Error);
  EXPECT_THROW(b.import_parameter("decoder.final_layernorm.weight", std::vector<float>(3)), Error);
}

TEST(Model, AttentionMaskMatters) {
  auto be = make_cpu_backend(1);
  Model m(tiny_config(false, true, ckpt::AttentionMask::kCausal, 1), *be);
  m.init(9);
  const Batch b;
  std::vector<float> causal(static_cast<std::size_t>(m.forward(b.input(AttentionKind::kCausal)).numel()));
  be->copy_to_host(m.forward(b.input(AttentionKind::kCausal)), causal);
  std::vector<float> bidir(causal.size());
  be->copy_to_host(m.forward(b.input(AttentionKind::kBidirectional)), bidir);
  const std::int64_t w = m.config().padded_vocab_size();
  double diff = 0;
  for (std::int64_t j = 0; j < w; ++j) diff += std::abs(causal[j] - bidir[j]);
  EXPECT_GT(diff, 1e-3);  // position 0 sees only itself when causal
}

TEST(ModelAdapters, TrainableLossIsTheWeightedSumAndParamsAreHostViews) {
  auto be = make_cpu_backend(1);
  Model m(tiny_config(false, false, ckpt::AttentionMask::kBidirectional, 1), *be);
  m.init(2);
  auto t = make_trainable_model(m);
  const Batch b;
  ModelBatch mb;
  mb.batch = 2;
  mb.seq = 5;
  mb.input_ids = b.ids;
  mb.position_ids = b.positions;
  mb.labels = b.labels;
  mb.weights = b.weights;
  const double expect = weighted_loss(m, b, AttentionKind::kBidirectional);
  EXPECT_NEAR(t->forward_loss(mb), expect, 1e-9);
  t->zero_grad();
  EXPECT_NEAR(t->forward_backward(mb), expect, 1e-9);
  auto params = t->parameters();
  ASSERT_EQ(params.size(), m.parameters().size());
  EXPECT_EQ(params.front().name, "embedding.word_embeddings.weight");
  EXPECT_FALSE(params[1].decay);  // the first layer norm
  EXPECT_EQ(std::vector<float>(params.back().grad.begin(), params.back().grad.end()),
            m.export_gradient("output_layer.weight"));
  params.back().value[0] = 123.0f;  // the optimizer writes the model's own memory
  EXPECT_EQ(m.export_parameter("output_layer.weight")[0], 123.0f);
}

TEST(ModelAdapters, LogitsFnMasksPaddedVocabularyAndLeftPadding) {
  auto be = make_cpu_backend(1);
  Model m(tiny_config(true, false, ckpt::AttentionMask::kBidirectional, 1), *be);
  m.init(4);
  auto fn = make_logits_fn(m);
  SequenceBatch padded{1, 4, {0, 0, 5, 6}, {0, 0, 1, 1}, {0, 0, 0, 1}};
  SequenceBatch plain{1, 2, {5, 6}, {1, 1}, {0, 1}};
  std::vector<float> a, b;
  fn(padded, a);
  fn(plain, b);
  const std::int64_t w = m.config().padded_vocab_size();
  ASSERT_EQ(a.size(), std::size_t(4 * w));
  for (std::int64_t j = 13; j < w; ++j) EXPECT_EQ(a[3 * w + j], -std::numeric_limits<float>::infinity());
  for (std::int64_t j = 0; j < 13; ++j) {  // padding keys are invisible: the same logits as unpadded
    EXPECT_NEAR(a[2 * w + j], b[0 * w + j], 1e-5);
    EXPECT_NEAR(a[3 * w + j], b[1 * w + j], 1e-5);
  }
}

}  // namespace
}  // namespace dlm::train
