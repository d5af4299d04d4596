#include <cmath>
#include <numeric>

#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "dlm/train/objective.h"
#include "dlm/train/philox.h"

namespace dlm::train {
namespace {

TEST(Philox, KnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}), (PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

SampleBatch batch_of(std::int64_t b, std::int64_t l, std::uint64_t first_sample = 0) {
  SampleBatch s;
  s.batch = b;
  s.seq = l;
  for (std::int64_t i = 0; i < b * l; ++i) {
    s.tokens.push_back(static_cast<std::int32_t>(100 + i));
    s.labels.push_back(static_cast<std::int32_t>(101 + i));
    s.loss_mask.push_back(1.0f);
  }
  for (std::int64_t i = 0; i < b; ++i) s.sample_index.push_back(first_sample + static_cast<std::uint64_t>(i));
  return s;
}

ObjectiveOptions diffusion(std::uint64_t seed = 7) {
  ObjectiveOptions o;
  o.mask_token = 5;
  o.varilen_prob = 0;
  o.seed = seed;
  return o;
}

TEST(MaskedDiffusion, UnshiftsAndWeightsByTheEmpiricalRate) {
  auto s = batch_of(3, 6);
  s.loss_mask[1] = 0;  // row 0, column 1
  auto m = make_model_batch(diffusion(), s, {});
  ASSERT_EQ(m.batch, 3);
  ASSERT_EQ(m.seq, 5);
  EXPECT_FALSE(m.causal);
  const double mask_sum = 3 * 5 - 1;
  for (std::int64_t b = 0; b < 3; ++b) {
    int count = 0;
    for (std::int64_t j = 0; j < 5; ++j) count += m.masked[static_cast<std::size_t>(b * 5 + j)];
    ASSERT_GE(count, 1) << "row " << b << " has no masked position";
    for (std::int64_t j = 0; j < 5; ++j) {
      auto i = static_cast<std::size_t>(b * 5 + j);
      // input = tokens[:, 1:], labels = labels[:, :-1]: the same clean token at each position.
      EXPECT_EQ(m.labels[i], 101 + b * 6 + j);
      EXPECT_EQ(m.position_ids[i], j + 1);
      const float lm = (b == 0 && j == 1) ? 0.0f : 1.0f;
      if (m.masked[i]) {
        EXPECT_EQ(m.input_ids[i], 5);
        EXPECT_FLOAT_EQ(m.weights[i], static_cast<float>(lm * 5.0 / count / mask_sum));
      } else {
        EXPECT_EQ(m.input_ids[i], 100 + b * 6 + j + 1);
        EXPECT_EQ(m.weights[i], 0.0f);
      }
    }
  }
}

TEST(MaskedDiffusion, ConstantCrossEntropyGivesThatLossExactly) {
  // sum_j masked_j * (n / count) / (B n) = 1 per row / B: the estimator is exact for a constant CE.
  auto s = batch_of(4, 9);
  auto m = make_model_batch(diffusion(3), s, {});
  double total = std::accumulate(m.weights.begin(), m.weights.end(), 0.0);
  EXPECT_NEAR(total, 1.0, 1e-6);
}

TEST(MaskedDiffusion, NoiseIsKeyedByGlobalSampleIndex) {
  // Sample 11 in a batch starting at 10 (row 1) and in one starting at 11 (row 0): the same mask.
  auto a = make_model_batch(diffusion(), batch_of(2, 17, 10), {});
  auto b = make_model_batch(diffusion(), batch_of(1, 17, 11), {});
  for (std::int64_t j = 0; j < 16; ++j) EXPECT_EQ(a.masked[static_cast<std::size_t>(16 + j)], b.masked[static_cast<std::size_t>(j)]);
  // Another seed draws other masks.
  auto c = make_model_batch(diffusion(8), batch_of(2, 17, 10), {});
  EXPECT_NE(a.masked, c.masked);
}

TEST(MaskedDiffusion, MaskLevelsAreUniform) {
  // E[masked fraction] = E[t] = 1/2; fraction of rows with exactly the forced mask is small.
  auto m = make_model_batch(diffusion(1), batch_of(4000, 33), {});
  double frac = std::accumulate(m.masked.begin(), m.masked.end(), 0.0) / static_cast<double>(m.masked.size());
  EXPECT_NEAR(frac, 0.5, 0.02);
}

TEST(MaskedDiffusion, FixedSeedRegression) {
  auto m = make_model_batch(diffusion(1234), batch_of(1, 9), {});
  std::vector<std::uint8_t> expected = m.masked;  // recomputed from the stream directly
  CounterRng rng(1234);
  double t = rng.uniform(1, 0, 0);
  int count = 0;
  for (std::uint32_t j = 0; j < 8; ++j) count += expected[j] = rng.uniform(2, 0, j) < t;
  if (count == 0) expected[static_cast<std::size_t>(rng.uniform(3, 0, 0) * 8)] = 1;
  EXPECT_EQ(m.masked, expected);
}

TEST(MaskedDiffusion, VariableLengthCutsEveryRowAlike) {
  auto o = diffusion();
  o.varilen_prob = 1.0;
  auto s = batch_of(2, 64);
  // numpy: RandomState(3 * 4 + 1).randint(2, 65) after one uniform() (the interop test checks the draw).
  const std::int64_t r = variable_length(1.0, 13, 64);
  ASSERT_GE(r, 2);
  ASSERT_LE(r, 64);
  auto m = make_model_batch(o, s, {3, 4, 1, true});
  EXPECT_EQ(m.seq, r - 1);
  EXPECT_EQ(m.labels[static_cast<std::size_t>(m.seq)], 101 + 64);  // row 1 starts at label column 0
  // Validation never cuts; prob 0 never cuts.
  EXPECT_EQ(make_model_batch(o, s, {3, 4, 1, false}).seq, 63);
  EXPECT_EQ(variable_length(0.0, 13, 64), 64);
}

TEST(MaskedDiffusion, LladaWeightsByTheLevel) {
  auto o = diffusion();
  o.kind = ObjectiveKind::kDiffusionLlada;
  auto s = batch_of(2, 8);
  auto m = make_model_batch(o, s, {});
  ASSERT_EQ(m.seq, 8);
  CounterRng rng(o.seed);
  for (std::int64_t b = 0; b < 2; ++b) {
    const double p = (1 - 1e-3) * rng.uniform(1, static_cast<std::uint64_t>(b), 0) + 1e-3;
    for (std::int64_t j = 0; j < 8; ++j) {
      auto i = static_cast<std::size_t>(b * 8 + j);
      EXPECT_EQ(m.labels[i], s.tokens[i]);
      EXPECT_EQ(m.position_ids[i], j);
      EXPECT_FLOAT_EQ(m.weights[i], m.masked[i] ? static_cast<float>(1.0 / p / 16.0) : 0.0f);
    }
  }
}

TEST(Autoregressive, AveragesOverTheLossMask) {
  ObjectiveOptions o;
  o.kind = ObjectiveKind::kAutoregressive;
  auto s = batch_of(2, 4);
  s.loss_mask[3] = 0;
  auto m = make_model_batch(o, s, {});
  EXPECT_TRUE(m.causal);
  EXPECT_EQ(m.input_ids, s.tokens);
  EXPECT_EQ(m.labels, s.labels);
  EXPECT_FLOAT_EQ(m.weights[0], 1.0f / 7);
  EXPECT_EQ(m.weights[3], 0.0f);
  EXPECT_EQ(m.position_ids[5], 1);
}

TEST(Objective, RejectsBadInput) {
  ObjectiveOptions o;
  o.varilen_prob = 0;
  EXPECT_THROW(make_model_batch(o, batch_of(1, 4), {}), Error);  // no mask token
  auto s = batch_of(2, 4);
  s.sample_index.pop_back();
  EXPECT_THROW(make_model_batch(diffusion(), s, {}), Error);
  EXPECT_THROW(parse_objective_kind("mdlm"), Error);
}

TEST(WeightedCrossEntropy, ValueAndGradient) {
  ModelBatch m;
  m.batch = 1;
  m.seq = 2;
  m.labels = {0, 2};
  m.weights = {0.5f, 0.25f};
  // Row 0: logits (ln 1, ln 2, ln 1): CE at 0 = ln 4. Row 1: uniform over 3: CE = ln 3.
  std::vector<float> logits = {0.0f, static_cast<float>(std::log(2.0)), 0.0f, 1.0f, 1.0f, 1.0f};
  std::vector<float> grad(6);
  double loss = weighted_cross_entropy(logits, 3, m, grad);
  EXPECT_NEAR(loss, 0.5 * std::log(4.0) + 0.25 * std::log(3.0), 1e-6);
  EXPECT_NEAR(grad[0], 0.5 * (0.25 - 1), 1e-6);
  EXPECT_NEAR(grad[1], 0.5 * 0.5, 1e-6);
  EXPECT_NEAR(grad[5], 0.25 * (1.0 / 3 - 1), 1e-6);
  // Finite differences on every logit.
  for (std::size_t k = 0; k < logits.size(); ++k) {
    auto plus = logits, minus = logits;
    plus[k] += 1e-3f;
    minus[k] -= 1e-3f;
    double fd = (weighted_cross_entropy(plus, 3, m) - weighted_cross_entropy(minus, 3, m)) / 2e-3;
    EXPECT_NEAR(grad[k], fd, 1e-3) << k;
  }
  m.labels[1] = 3;
  EXPECT_THROW(weighted_cross_entropy(logits, 3, m), Error);
}

}  // namespace
}  // namespace dlm::train
