// Every CPU backend op: forward values against a direct double-precision evaluation of the formula in
// backend.h, and backward against central finite differences of sum(out * R).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "dlm/common/error.h"
#include "dlm/train/backend.h"
#include "gradcheck.h"

namespace dlm::train {
namespace {

using testing::dot;
using testing::numeric_gradient;
using testing::random_vector;
using testing::relative_error;

constexpr double kTol = 5e-3;

class Ops : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(2);

  Tensor up(std::vector<std::int64_t> shape, const std::vector<float>& v) {
    Tensor t = be->alloc(std::move(shape), DType::kF32);
    be->copy_from_host(t, v);
    return t;
  }
  Tensor up_i32(std::vector<std::int64_t> shape, const std::vector<std::int32_t>& v) {
    Tensor t = be->alloc(std::move(shape), DType::kI32);
    be->copy_from_host(t, v);
    return t;
  }
  Tensor zeros(std::vector<std::int64_t> shape) {
    Tensor t = be->alloc(std::move(shape), DType::kF32);
    be->zero(t);
    return t;
  }
  std::vector<float> down(const Tensor& t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    be->copy_to_host(t, v);
    return v;
  }
};

TEST_F(Ops, EmbeddingForwardCopiesRowsAndBackwardScattersRepeats) {
  auto table = random_vector(6 * 4, 1);
  const std::vector<std::int32_t> ids = {1, 3, 1, 0, 5};
  auto R = random_vector(5 * 4, 2);
  Tensor ids_t = up_i32({5}, ids), out = be->alloc({5, 4});
  auto loss = [&] {
    be->embedding_forward(up({6, 4}, table), ids_t, out);
    return dot(down(out), R);
  };
  loss();
  auto o = down(out);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(o[i * 4 + j], table[ids[i] * 4 + j]);
  Tensor dtable = up({6, 4}, std::vector<float>(24, 0.5f));  // accumulates onto what is there
  be->embedding_backward(up({5, 4}, R), ids_t, dtable);
  auto g = down(dtable);
  for (auto& x : g) x -= 0.5f;
  EXPECT_LT(relative_error(g, numeric_gradient(table, loss)), kTol);
  EXPECT_FLOAT_EQ(g[1 * 4 + 2], R[0 * 4 + 2] + R[2 * 4 + 2]);  // id 1 appears twice
  EXPECT_EQ(g[2 * 4], 0.0f);                                   // id 2 never
  EXPECT_THROW(be->embedding_forward(up({6, 4}, table), up_i32({1}, {6}), be->alloc({1, 4})), Error);
}

TEST_F(Ops, RmsNorm) {
  const int rows = 3, d = 8;
  auto x = random_vector(rows * d, 3), w = random_vector(d, 4, 0.3f), R = random_vector(rows * d, 5);
  for (auto& v : w) v += 1.0f;
  const double eps = 1e-6;
  Tensor y = be->alloc({rows, d}), rstd = be->alloc({rows});
  auto loss = [&] {
    be->rmsnorm_forward(up({rows, d}, x), up({d}, w), eps, y, rstd);
    return dot(down(y), R);
  };
  loss();
  auto yv = down(y);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int j = 0; j < d; ++j) ss += double(x[r * d + j]) * x[r * d + j];
    const double s = 1 / std::sqrt(ss / d + eps);
    for (int j = 0; j < d; ++j) EXPECT_NEAR(yv[r * d + j], w[j] * x[r * d + j] * s, 1e-5);
  }
  Tensor dx = be->alloc({rows, d}), dw = zeros({d});
  be->rmsnorm_backward(up({rows, d}, R), up({rows, d}, x), up({d}, w), rstd, dx, dw);
  EXPECT_LT(relative_error(down(dx), numeric_gradient(x, loss)), kTol);
  EXPECT_LT(relative_error(down(dw), numeric_gradient(w, loss)), kTol);
}

TEST_F(Ops, LinearAndWeightGradientAccumulates) {
  const int n = 3, k = 5, m = 4;
  auto x = random_vector(n * k, 6), w = random_vector(m * k, 7), R = random_vector(n * m, 8);
  Tensor y = be->alloc({n, m});
  auto loss = [&] {
    be->linear_forward(up({n, k}, x), up({m, k}, w), y);
    return dot(down(y), R);
  };
  loss();
  auto yv = down(y);
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < m; ++o) {
      double s = 0;
      for (int j = 0; j < k; ++j) s += double(x[i * k + j]) * w[o * k + j];
      EXPECT_NEAR(yv[i * m + o], s, 1e-5);
    }
  Tensor dx = be->alloc({n, k}), dw = up({m, k}, std::vector<float>(m * k, 1.0f));
  be->linear_backward(up({n, m}, R), up({n, k}, x), up({m, k}, w), dx, dw);
  auto dwv = down(dw);
  for (auto& v : dwv) v -= 1.0f;
  EXPECT_LT(relative_error(down(dx), numeric_gradient(x, loss)), kTol);
  EXPECT_LT(relative_error(dwv, numeric_gradient(w, loss)), kTol);
}

TEST_F(Ops, SplitQkvFollowsMegatronGroupLayout) {
  const int n = 2, heads = 4, groups = 2, d = 2, width = groups * (heads / groups + 2) * d;  // 16
  std::vector<float> qkv(n * width);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(i);
  Tensor q = be->alloc({n, heads, d}), k = be->alloc({n, groups, d}), v = be->alloc({n, groups, d});
  be->split_qkv_forward(up({n, width}, qkv), q, k, v);
  auto qv = down(q), kv = down(k), vv = down(v);
  // token 1, group 1 starts at 16 + 8: [q head 2 | q head 3 | k | v], two values each.
  EXPECT_EQ(qv[(1 * heads + 2) * d], 24.0f);
  EXPECT_EQ(qv[(1 * heads + 3) * d + 1], 27.0f);
  EXPECT_EQ(kv[(1 * groups + 1) * d], 28.0f);
  EXPECT_EQ(vv[(1 * groups + 1) * d + 1], 31.0f);
  EXPECT_EQ(kv[0], 4.0f);
  Tensor back = be->alloc({n, width});
  be->split_qkv_backward(q, k, v, back);
  EXPECT_EQ(down(back), qkv);
}

TEST_F(Ops, RopeRotatesHalvesAndBackwardIsTheInverse) {
  const int n = 3, heads = 2, d = 8;
  const double theta = 10000;
  auto x = random_vector(n * heads * d, 9), R = random_vector(n * heads * d, 10);
  const std::vector<std::int32_t> pos = {0, 5, 17};
  Tensor p = up_i32({n}, pos), y = be->alloc({n, heads, d});
  auto loss = [&] {
    be->rope_forward(up({n, heads, d}, x), p, theta, y);
    return dot(down(y), R);
  };
  loss();
  auto yv = down(y);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < d / 2; ++i) {
        const double a = pos[t] * std::pow(theta, -2.0 * i / d);
        const float* xr = x.data() + (t * heads + h) * d;
        EXPECT_NEAR(yv[(t * heads + h) * d + i], xr[i] * std::cos(a) - xr[i + d / 2] * std::sin(a), 1e-5);
        EXPECT_NEAR(yv[(t * heads + h) * d + i + d / 2], xr[i + d / 2] * std::cos(a) + xr[i] * std::sin(a), 1e-5);
      }
  Tensor dx = be->alloc({n, heads, d});
  be->rope_backward(up({n, heads, d}, R), p, theta, dx);
  EXPECT_LT(relative_error(down(dx), numeric_gradient(x, loss)), kTol);
  Tensor same = up({n, heads, d}, x);  // in place, and backward undoes forward
  be->rope_forward(same, p, theta, same);
  be->rope_backward(same, p, theta, same);
  auto back = down(same);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-5);
}

struct AttentionCase {
  AttentionKind kind;
  bool padded;
};

class Attention : public Ops, public ::testing::WithParamInterface<AttentionCase> {};

TEST_P(Attention, GqaForwardAndGradients) {
  const int B = 2, L = 5, H = 4, G = 2, D = 4;
  const auto [kind, padded] = GetParam();
  auto q = random_vector(B * L * H * D, 11), k = random_vector(B * L * G * D, 12), v = random_vector(B * L * G * D, 13);
  auto R = random_vector(B * L * H * D, 14);
  const std::vector<std::uint8_t> valid = {1, 1, 0, 1, 1, 0, 1, 1, 1, 1};
  Tensor kv_mask;
  if (padded) {
    kv_mask = be->alloc({B, L}, DType::kU8);
    be->copy_from_host(kv_mask, std::span<const std::uint8_t>(valid));
  }
  Tensor out = be->alloc({B, L, H, D}), lse = be->alloc({B, H, L});
  auto loss = [&] {
    be->attention_forward(up({B, L, H, D}, q), up({B, L, G, D}, k), up({B, L, G, D}, v), kind, kv_mask, out, lse);
    return dot(down(out), R);
  };
  loss();
  // Reference: softmax in double, head h reading KV head h / (H / G).
  auto o = down(out);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < L; ++i) {
        const int g = h / (H / G);
        std::vector<double> s(L, -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j < L; ++j) {
          if ((kind == AttentionKind::kCausal && j > i) || (padded && !valid[b * L + j])) continue;
          double acc = 0;
          for (int c = 0; c < D; ++c) acc += double(q[((b * L + i) * H + h) * D + c]) * k[((b * L + j) * G + g) * D + c];
          s[j] = acc / std::sqrt(double(D));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (int j = 0; j < L; ++j) z += s[j] == -INFINITY ? 0 : std::exp(s[j] - m);
        for (int c = 0; c < D; ++c) {
          double acc = 0;
          for (int j = 0; j < L; ++j)
            if (s[j] != -INFINITY) acc += std::exp(s[j] - m) / z * v[((b * L + j) * G + g) * D + c];
          if (m == -INFINITY) acc = 0;  // causal + padding: query 0 of row 1 sees nothing
          EXPECT_NEAR(o[((b * L + i) * H + h) * D + c], acc, 1e-5) << b << " " << h << " " << i;
        }
      }
  Tensor dq = be->alloc({B, L, H, D}), dk = be->alloc({B, L, G, D}), dv = be->alloc({B, L, G, D});
  be->attention_backward(up({B, L, H, D}, R), up({B, L, H, D}, q), up({B, L, G, D}, k), up({B, L, G, D}, v), out, lse,
                         kind, kv_mask, dq, dk, dv);
  EXPECT_LT(relative_error(down(dq), numeric_gradient(q, loss)), kTol);
  EXPECT_LT(relative_error(down(dk), numeric_gradient(k, loss)), kTol);
  EXPECT_LT(relative_error(down(dv), numeric_gradient(v, loss)), kTol);
  if (padded) {  // a padding key gets no gradient
    auto dkv = down(dk);
    for (int c = 0; c < G * D; ++c) EXPECT_EQ(dkv[(0 * L + 2) * G * D + c], 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, Attention,
                         ::testing::Values(AttentionCase{AttentionKind::kBidirectional, false},
                                           AttentionCase{AttentionKind::kCausal, false},
                                           AttentionCase{AttentionKind::kBidirectional, true},
                                           AttentionCase{AttentionKind::kCausal, true}));

TEST_F(Ops, SwiGlu) {
  const int n = 3, f = 5;
  auto gu = random_vector(n * 2 * f, 15, 2.0f), R = random_vector(n * f, 16);
  Tensor out = be->alloc({n, f});
  auto loss = [&] {
    be->swiglu_forward(up({n, 2 * f}, gu), out);
    return dot(down(out), R);
  };
  loss();
  auto o = down(out);
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < f; ++j) {
      const double g = gu[t * 2 * f + j], u = gu[t * 2 * f + f + j];
      EXPECT_NEAR(o[t * f + j], g / (1 + std::exp(-g)) * u, 1e-5);
    }
  Tensor d = be->alloc({n, 2 * f});
  be->swiglu_backward(up({n, f}, R), up({n, 2 * f}, gu), d);
  EXPECT_LT(relative_error(down(d), numeric_gradient(gu, loss)), kTol);
}

TEST_F(Ops, CrossEntropySlicesPaddedVocabularyAndWeightsRows) {
  const int n = 4, vocab = 6, width = 8;
  auto logits = random_vector(n * width, 17, 2.0f);
  const std::vector<std::int32_t> labels = {2, -1, 5, 0};
  const std::vector<float> w = {0.5f, 1.0f, 2.0f, 0.25f};
  Tensor lab = up_i32({n}, labels), ce = be->alloc({n}), lse = be->alloc({n});
  auto loss = [&] {  // the weighted loss the model trains on
    be->cross_entropy_forward(up({n, width}, logits), lab, vocab, ce, lse);
    return dot(down(ce), w);
  };
  loss();
  auto c = down(ce);
  for (int t = 0; t < n; ++t) {
    double z = 0;
    for (int j = 0; j < vocab; ++j) z += std::exp(double(logits[t * width + j]));
    const double expect = labels[t] < 0 ? 0 : std::log(z) - logits[t * width + labels[t]];
    EXPECT_NEAR(c[t], expect, 1e-5);
  }
  Tensor d = be->alloc({n, width});
  be->cross_entropy_backward(up({n, width}, logits), lab, lse, up({n}, w), vocab, d);
  auto dv = down(d);
  EXPECT_LT(relative_error(dv, numeric_gradient(logits, loss)), kTol);
  for (int t = 0; t < n; ++t)
    for (int j = vocab; j < width; ++j) EXPECT_EQ(dv[t * width + j], 0.0f);
  for (int j = 0; j < width; ++j) EXPECT_EQ(dv[1 * width + j], 0.0f);  // ignored label
  // A huge padded logit changes nothing: padding never wins.
  auto padded = logits;
  padded[7] = 1e4f;
  be->cross_entropy_forward(up({n, width}, padded), lab, vocab, ce, lse);
  EXPECT_EQ(down(ce), c);
  EXPECT_THROW(be->cross_entropy_forward(up({n, width}, logits), up_i32({n}, {6, 0, 0, 0}), vocab, ce, lse), Error);
}

TEST_F(Ops, ShapeMismatchIsAnError) {
  EXPECT_THROW(be->linear_forward(be->alloc({3, 5}), be->alloc({4, 6}), be->alloc({3, 4})), Error);
  EXPECT_THROW(be->alloc({2, 2}).reshape({3}), Error);
  EXPECT_THROW(be->alloc({2}, DType::kBF16), Error);
  std::vector<float> three(3);
  EXPECT_THROW(be->copy_from_host(be->alloc({2, 2}), three), Error);
}

}  // namespace
}  // namespace dlm::train
