// QK-norm + RoPE (qk_norm_rope.cu), forward and backward, against double-precision host references: the output
// in the attention layout, rstd, dqkv in the grouped projection layout (v copied through) and the norm weights'
// gradients (accumulated into, +=). Head dims 16 to 128, GQA and MHA, with and without the norm, with v copied
// through or left alone (copy_v = false: its slots keep their garbage both ways), an odd token count; and the
// weight gradients twice for the same bits (fixed-order sums).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels.h"
#include "gpu_test_util.h"

namespace dlm::train::cuda {
namespace {

using gpu_test::DeviceVec;
using gpu_test::have_device;
using gpu_test::rel_error;

struct QkCase {
  int head_dim, heads, groups;
  bool qk_norm, copy_v = true;
};

class QkNormRopeTest : public ::testing::TestWithParam<QkCase> {};

TEST_P(QkNormRopeTest, ForwardAndBackwardMatchReference) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const QkCase c = GetParam();
  const int D = c.head_dim, H = c.heads, G = c.groups, per = H / G, half = D / 2, tokens = 301, max_pos = 64;
  const int slots = H + 2 * G, normed = H + G;
  const float eps = 1e-6f;
  std::mt19937 rng(static_cast<unsigned>(D * 131 + H * 7 + G));
  std::vector<float> qkv_f, dout_f;
  const auto qkv = gpu_test::random_bf16(std::size_t(tokens) * slots * D, rng, 1.0f, qkv_f);
  const auto dout = gpu_test::random_bf16(std::size_t(tokens) * slots * D, rng, 1.0f, dout_f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qn(D), kn(D), dqn0(D), dkn0(D);
  for (int i = 0; i < D; ++i) qn[i] = 1.0f + 0.2f * normal(rng), kn[i] = 1.0f + 0.2f * normal(rng);
  for (int i = 0; i < D; ++i) dqn0[i] = normal(rng), dkn0[i] = normal(rng);
  std::vector<int> positions(tokens);
  for (auto& p : positions) p = static_cast<int>(rng() % max_pos);
  std::vector<float> cos_t(std::size_t(max_pos) * half), sin_t(cos_t.size());
  for (int p = 0; p < max_pos; ++p)
    for (int i = 0; i < half; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / D);
      cos_t[std::size_t(p) * half + i] = static_cast<float>(std::cos(angle));
      sin_t[std::size_t(p) * half + i] = static_cast<float>(std::sin(angle));
    }
  // Slot n in attention order [q heads | k groups | v groups] -> offset of its head in the grouped layout.
  auto grouped = [&](int n) {
    if (n < H) return (n / per * (per + 2) + n % per) * D;
    if (n < H + G) return ((n - H) * (per + 2) + per) * D;
    return ((n - H - G) * (per + 2) + per + 1) * D;
  };
  std::vector<double> out(qkv_f.size()), rstd(std::size_t(tokens) * normed, 1.0), dqkv(qkv_f.size());
  std::vector<double> dqn(dqn0.begin(), dqn0.end()), dkn(dkn0.begin(), dkn0.end());
  for (int t = 0; t < tokens; ++t)
    for (int n = 0; n < slots; ++n) {
      const std::size_t in = std::size_t(t) * slots * D + grouped(n), at = (std::size_t(t) * slots + n) * D;
      if (n >= H + G) {
        for (int i = 0; i < D; ++i) out[at + i] = qkv_f[in + i], dqkv[in + i] = dout_f[at + i];
        continue;
      }
      const float* w = n < H ? qn.data() : kn.data();
      double ss = 0;
      for (int i = 0; i < D; ++i) ss += double(qkv_f[in + i]) * qkv_f[in + i];
      const double r = c.qk_norm ? 1.0 / std::sqrt(ss / D + eps) : 1.0;
      rstd[std::size_t(t) * normed + n] = r;
      std::vector<double> y(D), dy(D);
      for (int i = 0; i < D; ++i) y[i] = qkv_f[in + i] * r * (c.qk_norm ? w[i] : 1.0f);
      const std::size_t cs = std::size_t(positions[t]) * half;
      for (int i = 0; i < half; ++i) {
        const double co = cos_t[cs + i], si = sin_t[cs + i];
        out[at + i] = y[i] * co - y[i + half] * si;
        out[at + i + half] = y[i + half] * co + y[i] * si;
        dy[i] = dout_f[at + i] * co + dout_f[at + i + half] * si;
        dy[i + half] = dout_f[at + i + half] * co - dout_f[at + i] * si;
      }
      double dot = 0;
      for (int i = 0; i < D; ++i) dot += dy[i] * (c.qk_norm ? w[i] : 1.0) * qkv_f[in + i] * r;
      dot /= D;
      for (int i = 0; i < D; ++i) {
        const double xh = qkv_f[in + i] * r;
        dqkv[in + i] = c.qk_norm ? r * (dy[i] * w[i] - xh * dot) : dy[i];
        if (c.qk_norm) (n < H ? dqn : dkn)[i] += dy[i] * xh;
      }
    }
  const QkvShape s{tokens, H, G, D, c.qk_norm, eps, c.copy_v};
  DeviceVec<bf16> d_qkv(qkv), d_dout(dout), d_out(qkv.size()), d_dqkv(qkv.size());
  DeviceVec<float> d_rstd(rstd.size()), d_qn(qn), d_kn(kn), d_cos(cos_t), d_sin(sin_t);
  DeviceVec<int> d_pos(positions);
  DeviceVec<float> partial(std::size_t(qk_norm_partial_floats(s)));
  cudaMemset(d_out.get(), 0xff, qkv.size() * 2);  // NaN garbage: every element (but v's, when not copied) written
  qk_norm_rope_forward(s, d_qkv.get(), d_out.get(), d_rstd.get(), d_qn.get(), d_kn.get(), d_pos.get(), d_cos.get(),
                       d_sin.get(), nullptr);
  // Without copy_v, v's slots keep their NaN garbage both ways: compare them as that, and the rest as computed.
  auto keep_v = [&](std::vector<double> want, bool attention_layout) {
    if (c.copy_v) return want;
    for (int t = 0; t < tokens; ++t)
      for (int n = H + G; n < slots; ++n)
        for (int i = 0; i < D; ++i)
          want[std::size_t(t) * slots * D + (attention_layout ? std::size_t(n) * D : grouped(n)) + i] = 0;
    return want;
  };
  auto zero_v = [&](std::vector<float> got, bool attention_layout) {
    if (c.copy_v) return got;
    for (int t = 0; t < tokens; ++t)
      for (int n = H + G; n < slots; ++n)
        for (int i = 0; i < D; ++i) {
          float& x = got[std::size_t(t) * slots * D + (attention_layout ? std::size_t(n) * D : grouped(n)) + i];
          EXPECT_TRUE(std::isnan(x)) << "v slot written at token " << t;
          x = 0;
        }
    return got;
  };
  EXPECT_LT(rel_error(zero_v(gpu_test::to_float(d_out.download()), true), keep_v(out, true)), 8e-3);
  if (c.qk_norm) EXPECT_LT(rel_error(d_rstd.download(), rstd), 1e-5);
  std::vector<float> first_dqn;
  for (int run = 0; run < 2; ++run) {
    DeviceVec<float> d_dqn(dqn0), d_dkn(dkn0);
    cudaMemset(d_dqkv.get(), 0xff, qkv.size() * 2);  // NaN garbage: every element must be written
    qk_norm_rope_backward(s, d_dout.get(), d_qkv.get(), d_rstd.get(), d_qn.get(), d_kn.get(), d_pos.get(), d_cos.get(),
                          d_sin.get(), d_dqkv.get(), d_dqn.get(), d_dkn.get(), partial.get(), nullptr);
    EXPECT_LT(rel_error(zero_v(gpu_test::to_float(d_dqkv.download()), false), keep_v(dqkv, false)), 8e-3);
    const auto got_dqn = d_dqn.download(), got_dkn = d_dkn.download();
    EXPECT_LT(rel_error(got_dqn, dqn), 1e-5);
    EXPECT_LT(rel_error(got_dkn, dkn), 1e-5);
    if (run == 0) first_dqn = got_dqn;
    else EXPECT_EQ(std::memcmp(first_dqn.data(), got_dqn.data(), got_dqn.size() * 4), 0) << "dqn differs between runs";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, QkNormRopeTest,
                         ::testing::Values(QkCase{64, 16, 8, true}, QkCase{128, 16, 8, true}, QkCase{32, 4, 2, true},
                                           QkCase{16, 6, 3, true}, QkCase{128, 16, 16, true},
                                           QkCase{64, 4, 4, false}, QkCase{64, 16, 8, true, false},
                                           QkCase{128, 16, 8, true, false}, QkCase{32, 6, 2, false, false}));

}  // namespace
}  // namespace dlm::train::cuda
