// Mixture of experts: the router (top-k ties, norm_topk_prob, the sigmoid scores, Megatron's aux and z losses
// and their gradients), the CPU experts op against a direct evaluation and finite differences, and a whole
// MoE model's gradients (cross-entropy plus router losses) against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "dlm/common/error.h"
#include "dlm/train/model.h"
#include "dlm/train/moe_router.h"
#include "gradcheck.h"

namespace dlm::train {
namespace {

using testing::expect_parameter_gradients_match;
using testing::numeric_gradient;
using testing::random_vector;
using testing::relative_error;

RouterOptions options(int experts, int topk, bool norm, ckpt::MoeScoreFunction score = ckpt::MoeScoreFunction::kSoftmax) {
  RouterOptions o;
  o.experts = experts;
  o.topk = topk;
  o.norm_topk_prob = norm;
  o.score = score;
  return o;
}

TEST(MoeRouter, TopKTiesGoToTheLowerExpertAndWeightsFollowNormTopkProb) {
  // Token 0: experts 1, 2 and 3 tie for the top; token 1: all four tie.
  const std::vector<float> logits = {0.0f, 2.0f, 2.0f, 2.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  const Routing plain = route(options(4, 2, false), logits);
  EXPECT_EQ(plain.experts, (std::vector<std::int32_t>{1, 2, 0, 1}));
  const double z0 = 1 + 3 * std::exp(2.0);
  EXPECT_NEAR(plain.weights[0], std::exp(2.0) / z0, 1e-6);
  EXPECT_NEAR(plain.weights[1], std::exp(2.0) / z0, 1e-6);
  EXPECT_NEAR(plain.weights[2], 0.25, 1e-6);
  EXPECT_EQ(plain.tokens_per_expert, (std::vector<std::int64_t>{1, 2, 1, 0}));
  const Routing norm = route(options(4, 2, true), logits);
  EXPECT_EQ(norm.experts, plain.experts);
  for (float w : norm.weights) EXPECT_NEAR(w, 0.5, 1e-6);

  // Unequal top-k: normalised weights are the scores over their sum.
  const std::vector<float> one = {0.5f, -1.0f, 1.5f};
  const Routing r = route(options(3, 2, true), one);
  EXPECT_EQ(r.experts, (std::vector<std::int32_t>{2, 0}));
  EXPECT_NEAR(r.weights[0], 1 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0, 1e-6);
}

TEST(MoeRouter, SigmoidScoresAndRouterLossesFollowMegatron) {
  RouterOptions o = options(4, 2, true, ckpt::MoeScoreFunction::kSigmoid);
  o.aux_loss_coeff = 0.1;
  o.z_loss_coeff = 0.01;
  const std::vector<float> logits = random_vector(3 * 4, 5);
  const Routing r = route(o, logits);
  double aux = 0, z = 0;
  std::vector<double> a(4, 0.0);
  for (int n = 0; n < 3; ++n) {
    double total = 0, lse = 0;
    for (int e = 0; e < 4; ++e) total += 1 / (1 + std::exp(-double(logits[n * 4 + e])));
    for (int e = 0; e < 4; ++e) {
      const double s = 1 / (1 + std::exp(-double(logits[n * 4 + e])));
      EXPECT_NEAR(r.scores[n * 4 + e], s, 1e-6);
      a[e] += s / total;
      lse += std::exp(double(logits[n * 4 + e]));
    }
    z += std::log(lse) * std::log(lse);
    EXPECT_NEAR(r.weights[n * 2] + r.weights[n * 2 + 1], 1.0, 1e-6);
  }
  for (int e = 0; e < 4; ++e) aux += a[e] * double(r.tokens_per_expert[e]);
  EXPECT_NEAR(r.aux_loss, 0.1 * 4 / (2.0 * 9) * aux, 1e-7);
  EXPECT_NEAR(r.z_loss, 0.01 * z / 3, 1e-7);
  EXPECT_THROW(route(o, std::vector<float>{0, 1, NAN, 2}), Error);
}

// Capacity factor 1 with 4 tokens, 2 experts, top-1: C = ceil(4 / 2 * 1) = 2. Tokens 0, 1, 2 choose expert 0 with
// weights sigmoid(2), sigmoid(0.5), sigmoid(1) (softmax of two logits); token 3 chooses expert 1. By probs expert 0
// keeps tokens 0 and 2, by position tokens 0 and 1; the dropped weight is 0, the counts and the aux loss follow.
TEST(MoeRouter, CapacityDropsTheTokensMegatronDrops) {
  const std::vector<float> logits = {2.0f, 0.0f, 0.5f, 0.0f, 1.0f, 0.0f, 0.0f, 3.0f};
  RouterOptions o = options(2, 1, false);
  o.capacity_factor = 1.0;
  o.aux_loss_coeff = 1.0;
  const auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  const Routing probs = route(o, logits);
  EXPECT_EQ(probs.capacity, 2);
  EXPECT_EQ(probs.experts, (std::vector<std::int32_t>{0, 0, 0, 1}));
  EXPECT_EQ(probs.kept, (std::vector<std::uint8_t>{1, 0, 1, 1}));
  EXPECT_NEAR(probs.weights[0], sig(2), 1e-6);
  EXPECT_EQ(probs.weights[1], 0.0f);
  EXPECT_NEAR(probs.weights[2], sig(1), 1e-6);
  EXPECT_NEAR(probs.weights[3], sig(3), 1e-6);
  EXPECT_EQ(probs.tokens_per_expert, (std::vector<std::int64_t>{2, 1}));
  // aux = E / (k N^2) sum_e c_e sum_n s[n, e] with the kept counts.
  const double p0 = sig(2) + sig(0.5) + sig(1) + sig(-3);
  EXPECT_NEAR(probs.aux_loss, 2.0 / 16 * (2 * p0 + 1 * (4 - p0)), 1e-6);
  o.drop_policy = ckpt::MoeDropPolicy::kPosition;
  const Routing position = route(o, logits);
  EXPECT_EQ(position.kept, (std::vector<std::uint8_t>{1, 1, 0, 1}));
  EXPECT_EQ(position.weights[2], 0.0f);
  // A factor that leaves room drops nothing.
  o.capacity_factor = 1.5;
  EXPECT_EQ(route(o, logits).kept, (std::vector<std::uint8_t>{1, 1, 1, 1}));
}

// d(loss_weight * (aux + z) + sum dw . w) / d logits against finite differences, every router variant.
TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  for (auto score : {ckpt::MoeScoreFunction::kSoftmax, ckpt::MoeScoreFunction::kSigmoid})
    for (bool norm : {false, true})
    for (double capacity : {0.0, 0.5}) {
      RouterOptions o = options(6, 3, norm, score);
      o.capacity_factor = capacity;  // 0.5: C = ceil(15 / 6 * 0.5) = 2 of each expert's tokens
      o.aux_loss_coeff = 0.3;
      o.z_loss_coeff = 0.05;
      std::vector<float> logits = random_vector(5 * 6, 11, 1.5f);
      const std::vector<float> dw = random_vector(5 * 3, 12);
      const double weight = 0.7;
      auto loss = [&] {
        const Routing r = route(o, logits);
        double s = weight * (r.aux_loss + r.z_loss);
        for (std::size_t i = 0; i < dw.size(); ++i) s += double(dw[i]) * r.weights[i];
        return s;
      };
      const Routing r = route(o, logits);
      std::vector<float> analytic(logits.size());
      route_backward(o, r, dw, weight, analytic);
      const auto numeric = numeric_gradient(logits, loss, 1e-3f);
      if (capacity > 0) EXPECT_GT(std::count(r.kept.begin(), r.kept.end(), 0), 0);
      EXPECT_LT(relative_error(analytic, numeric), 2e-3) << "sigmoid " << (score == ckpt::MoeScoreFunction::kSigmoid)
                                                          << " norm " << norm << " capacity " << capacity;
    }
}

class MoeExperts : public ::testing::Test {
 protected:
  static constexpr std::int64_t N = 5, H = 6, F = 4, E = 3, K = 2;
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  std::vector<float> x = random_vector(N * H, 1), w = random_vector(N * K, 2), fc1 = random_vector(E * 2 * F * H, 3),
                     fc2 = random_vector(E * H * F, 4), r = random_vector(N * H, 5);
  std::vector<std::int32_t> idx = {2, 0, 1, 2, 0, 1, 2, 1, 0, 2};  // expert 0, 1, 2 each chosen by some tokens

  Tensor up(std::vector<std::int64_t> shape, const std::vector<float>& v) {
    Tensor t = be->alloc(std::move(shape), DType::kF32);
    be->copy_from_host(t, v);
    return t;
  }
  std::vector<float> forward() {
    Tensor ti = be->alloc({N, K}, DType::kI32);
    be->copy_from_host(ti, std::span<const std::int32_t>(idx));
    Tensor out = be->alloc({N, H}, DType::kF32), gu = be->alloc({N * K, 2 * F}, DType::kF32),
           act = be->alloc({N * K, F}, DType::kF32);
    be->moe_experts_forward(up({N, H}, x), ti, up({N, K}, w), up({E, 2 * F, H}, fc1), up({E, H, F}, fc2), out, gu, act);
    std::vector<float> host(N * H);
    be->copy_to_host(out, host);
    return host;
  }
};

TEST_F(MoeExperts, ForwardIsTheWeightedSumOfTheChosenSwiGluExperts) {
  const auto out = forward();
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t i = 0; i < H; ++i) {
      double want = 0;
      for (std::int64_t j = 0; j < K; ++j) {
        const std::int64_t e = idx[n * K + j];
        double y = 0;
        for (std::int64_t f = 0; f < F; ++f) {
          double g = 0, u = 0;
          for (std::int64_t c = 0; c < H; ++c) {
            g += double(fc1[(e * 2 * F + f) * H + c]) * x[n * H + c];
            u += double(fc1[(e * 2 * F + F + f) * H + c]) * x[n * H + c];
          }
          y += g / (1 + std::exp(-g)) * u * fc2[(e * H + i) * F + f];
        }
        want += w[n * K + j] * y;
      }
      EXPECT_NEAR(out[n * H + i], want, 1e-4 * (1 + std::abs(want)));
    }
}

TEST_F(MoeExperts, BackwardMatchesFiniteDifferences) {
  forward();
  Tensor ti = be->alloc({N, K}, DType::kI32);
  be->copy_from_host(ti, std::span<const std::int32_t>(idx));
  Tensor out = be->alloc({N, H}, DType::kF32), gu = be->alloc({N * K, 2 * F}, DType::kF32),
         act = be->alloc({N * K, F}, DType::kF32);
  const Tensor tx = up({N, H}, x), tw = up({N, K}, w), t1 = up({E, 2 * F, H}, fc1), t2 = up({E, H, F}, fc2);
  be->moe_experts_forward(tx, ti, tw, t1, t2, out, gu, act);
  Tensor dx = be->alloc({N, H}, DType::kF32), dw = be->alloc({N, K}, DType::kF32),
         d1 = up({E, 2 * F, H}, std::vector<float>(E * 2 * F * H, 0.0f)), d2 = up({E, H, F}, std::vector<float>(E * H * F, 0.0f));
  be->moe_experts_backward(up({N, H}, r), tx, ti, tw, t1, t2, gu, act, dx, dw, d1, d2);
  auto loss = [&] { return testing::dot(forward(), r); };
  auto host = [&](const Tensor& t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    be->copy_to_host(t, v);
    return v;
  };
  EXPECT_LT(relative_error(host(dx), numeric_gradient(x, loss)), 5e-3);
  EXPECT_LT(relative_error(host(dw), numeric_gradient(w, loss)), 5e-3);
  EXPECT_LT(relative_error(host(d1), numeric_gradient(fc1, loss)), 5e-3);
  EXPECT_LT(relative_error(host(d2), numeric_gradient(fc2, loss)), 5e-3);
}

struct MoeVariant {
  ckpt::MoeScoreFunction score = ckpt::MoeScoreFunction::kSoftmax;
  bool norm = false;
  int shared_expert = 0;   // moe_shared_expert_intermediate_size
  double capacity = 0;     // moe_expert_capacity_factor
};

ckpt::ModelConfig tiny_moe_config(const MoeVariant& v) {
  ckpt::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 8;
  c.ffn_hidden_size = 12;
  c.num_attention_heads = 2;
  c.num_query_groups = 1;
  c.kv_channels = 4;
  c.vocab_size = 13;
  c.make_vocab_size_divisible_by = 8;
  c.max_position_embeddings = 16;
  c.qk_layernorm = true;
  c.attention_mask = ckpt::AttentionMask::kCausal;
  c.init_method_std = 0.4;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 6;
  c.moe_layer_freq = 2;  // layer 0 MoE, layer 1 dense (Megatron's --moe-layer-freq 2)
  c.moe_router_score_function = v.score;
  c.moe_norm_topk_prob = v.norm;
  c.moe_aux_loss_coeff = 0.2;
  c.moe_z_loss_coeff = 0.05;
  c.moe_shared_expert_intermediate_size = v.shared_expert;
  c.moe_expert_capacity_factor = v.capacity;
  return c;
}

class MoeModelGradients : public ::testing::TestWithParam<MoeVariant> {};

// The loss sum_i w_i ce_i + router_loss_weight * (aux + z): every parameter against finite differences.
void expect_moe_gradients_match(const ckpt::ModelConfig& c) {
  auto be = make_cpu_backend(2);
  Model m(c, *be);
  m.init(3);
  EXPECT_TRUE(m.config().is_moe_layer(0));
  EXPECT_FALSE(m.config().is_moe_layer(1));
  const std::vector<std::int32_t> ids = {1, 5, 12, 3, 0, 7, 7, 2, 9, 11}, labels = {4, 5, -1, 12, 0, 1, 2, 3, 8, 6};
  const std::vector<float> weights = {0.3f, 1.0f, 0.7f, 0.2f, 0.5f, 0.9f, 0.1f, 0.6f, 0.4f, 0.8f};
  const double router_weight = 0.5;
  const ModelInput in{2, 5, ids, {}, {}, AttentionKind::kCausal, {}};
  auto loss = [&] {
    m.forward(in);
    const auto ce = m.cross_entropy(labels);
    double s = 0;
    for (std::size_t i = 0; i < ce.size(); ++i) s += double(weights[i]) * ce[i];
    for (const auto& st : m.moe_stats()) s += router_weight * (st.aux_loss + st.z_loss);
    return s;
  };
  m.zero_grad();
  loss();
  ASSERT_EQ(m.moe_stats().size(), 1u);
  EXPECT_GT(m.moe_stats()[0].aux_loss, 0.0);
  m.backward(weights, router_weight);
  expect_parameter_gradients_match(m, loss, 1e-3f, 1e-2, false);
}

TEST_P(MoeModelGradients, EveryParameterMatchesFiniteDifferences) {
  expect_moe_gradients_match(tiny_moe_config(GetParam()));
}

// A shared expert (Megatron's --moe-shared-expert-intermediate-size): its SwiGLU's output added to the experts'.
TEST(MoeModelGradientsShared, EveryParameterMatchesFiniteDifferences) {
  auto c = tiny_moe_config({ckpt::MoeScoreFunction::kSoftmax, true});
  c.moe_shared_expert_intermediate_size = 5;
  expect_moe_gradients_match(c);
}

INSTANTIATE_TEST_SUITE_P(Routers, MoeModelGradients,
                         ::testing::Values(MoeVariant{ckpt::MoeScoreFunction::kSoftmax, false},
                                           MoeVariant{ckpt::MoeScoreFunction::kSoftmax, true},
                                           MoeVariant{ckpt::MoeScoreFunction::kSigmoid, true},
                                           // a shared expert of width 5; a capacity that drops some of the 20 slots
                                           MoeVariant{ckpt::MoeScoreFunction::kSoftmax, true, 5},
                                           MoeVariant{ckpt::MoeScoreFunction::kSoftmax, true, 0, 0.6}));

TEST(MoeConfig, BadMoeConfigsAreRefusedNamingTheField) {
  auto be = make_cpu_backend(1);
  auto refused = [&](const ckpt::ModelConfig& c, const char* what) {
    try {
      Model m(c, *be);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  auto c = tiny_moe_config({ckpt::MoeScoreFunction::kSoftmax, true});
  c.moe_router_topk = 5;
  refused(c, "moe_router_topk 5 is more than num_experts 4");
  c = tiny_moe_config({ckpt::MoeScoreFunction::kSoftmax, true});
  c.moe_ffn_hidden_size = 0;
  refused(c, "moe_ffn_hidden_size");
  c = tiny_moe_config({ckpt::MoeScoreFunction::kSoftmax, true});
  c.moe_expert_capacity_factor = -1;
  refused(c, "moe_expert_capacity_factor -1");
  c = tiny_moe_config({ckpt::MoeScoreFunction::kSoftmax, true});
  c.moe_shared_expert_intermediate_size = -1;
  refused(c, "moe_shared_expert_intermediate_size must not be negative");
  c = tiny_moe_config({ckpt::MoeScoreFunction::kSoftmax, true});
  c.moe_layer_pattern = {1, 0, 1};
  refused(c, "moe_layer_pattern has 3 entries for 2 layers");
}

}  // namespace
}  // namespace dlm::train
