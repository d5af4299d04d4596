// The CUDA kernels against simple double-precision host references on fresh random inputs:
// flash attention forward and backward (bidirectional, causal, GQA, ragged sequence lengths), the
// vocabulary cross-entropy with padded columns, the device noising (bit-identical to make_model_batch),
// and the multi-tensor AdamW with global-norm clipping (against dlm::train::AdamW).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/master_split.h"
#include "dlm/train/objective.h"
#include "dlm/train/optimizer.h"
#include "gpu_test_util.h"

namespace dlm::train::cuda {
namespace {

using gpu_test::DeviceVec;
using gpu_test::have_device;
using gpu_test::rel_error;

struct AttentionCase {
  int batch, seq, heads, groups, head_dim;
  bool causal;
};

class AttentionTest : public ::testing::TestWithParam<AttentionCase> {};

// Reference on the attention's QKV layout: o, lse, and dq/dk/dv for a given dout.
void reference(const AttentionCase& c, const std::vector<float>& qkv, const std::vector<float>& dout,
               std::vector<double>& o, std::vector<double>& lse, std::vector<double>& dqkv) {
  const int per = c.heads / c.groups, D = c.head_dim, ld = (c.heads + 2 * c.groups) * D;
  const double scale = 1.0 / std::sqrt(double(D));
  o.assign(std::size_t(c.batch) * c.seq * c.heads * D, 0);
  lse.assign(std::size_t(c.batch) * c.heads * c.seq, 0);
  dqkv.assign(qkv.size(), 0);
  // Attention layout per token: [q of every head | k of every group | v of every group].
  auto q_at = [&](int b, int i, int h, int d) { return std::size_t(b * c.seq + i) * ld + std::size_t(h) * D + d; };
  auto k_at = [&](int b, int j, int g, int d) { return std::size_t(b * c.seq + j) * ld + std::size_t(c.heads + g) * D + d; };
  auto v_at = [&](int b, int j, int g, int d) { return k_at(b, j, g, d) + std::size_t(c.groups) * D; };
  std::vector<double> p(c.seq), dp(c.seq);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h) {
      const int g = h / per;
      for (int i = 0; i < c.seq; ++i) {
        const int kend = c.causal ? i + 1 : c.seq;
        double mx = -1e300;
        for (int j = 0; j < kend; ++j) {
          double s = 0;
          for (int d = 0; d < D; ++d) s += double(qkv[q_at(b, i, h, d)]) * qkv[k_at(b, j, g, d)];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j < kend; ++j) sum += std::exp(p[j] - mx);
        const double l = mx + std::log(sum);
        lse[std::size_t(b * c.heads + h) * c.seq + i] = l;
        const std::size_t orow = std::size_t(b * c.seq + i) * c.heads * D + std::size_t(h) * D;
        for (int j = 0; j < kend; ++j) {
          p[j] = std::exp(p[j] - l);
          for (int d = 0; d < D; ++d) o[orow + d] += p[j] * qkv[v_at(b, j, g, d)];
        }
        double delta = 0;
        for (int d = 0; d < D; ++d) delta += double(dout[orow + d]) * o[orow + d];
        for (int j = 0; j < kend; ++j) {
          double dpj = 0;
          for (int d = 0; d < D; ++d) dpj += double(dout[orow + d]) * qkv[v_at(b, j, g, d)];
          const double ds = p[j] * (dpj - delta);
          for (int d = 0; d < D; ++d) {
            dqkv[v_at(b, j, g, d)] += p[j] * dout[orow + d];
            dqkv[q_at(b, i, h, d)] += ds * qkv[k_at(b, j, g, d)] * scale;
            dqkv[k_at(b, j, g, d)] += ds * qkv[q_at(b, i, h, d)] * scale;
          }
        }
      }
    }
}

TEST_P(AttentionTest, ForwardAndBackwardMatchReference) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const AttentionCase c = GetParam();
  std::mt19937 rng(c.seq * 31 + c.head_dim + c.causal);
  const std::size_t tokens = std::size_t(c.batch) * c.seq, qkv_n = tokens * (c.heads + 2 * c.groups) * c.head_dim;
  std::vector<float> qkv_f, dout_f;
  auto qkv = gpu_test::random_bf16(qkv_n, rng, 1.0f, qkv_f);
  auto dout = gpu_test::random_bf16(tokens * c.heads * c.head_dim, rng, 1.0f, dout_f);
  DeviceVec<bf16> d_qkv(qkv), d_dout(dout), d_o(tokens * c.heads * c.head_dim), d_dqkv(qkv_n);
  DeviceVec<float> d_lse(tokens * c.heads), d_delta(tokens * c.heads);
  cudaMemset(d_o.get(), 0xff, tokens * c.heads * c.head_dim * 2);  // poison: NaN unless written
  cudaMemset(d_dqkv.get(), 0xff, qkv_n * 2);
  const AttentionShape s{c.batch, c.seq, c.heads, c.groups, c.head_dim, c.causal};
  attention_forward(s, d_qkv.get(), d_o.get(), d_lse.get(), nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  attention_backward(s, d_qkv.get(), d_o.get(), d_dout.get(), d_lse.get(), d_delta.get(), d_dqkv.get(), nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<double> o, lse, dqkv;
  reference(c, qkv_f, dout_f, o, lse, dqkv);
  // v's slots of dqkv hold dV; the reference accumulates everything into the same layout.
  EXPECT_LT(rel_error(gpu_test::to_float(d_o.download()), o), 1e-2);
  EXPECT_LT(rel_error(d_lse.download(), lse), 1e-4);
  EXPECT_LT(rel_error(gpu_test::to_float(d_dqkv.download()), dqkv), 2e-2);

  // The model's attention (cuDNN where built with it and the shape is taken, else the same kernels).
  Attention attention;
  cudaMemset(d_o.get(), 0xff, tokens * c.heads * c.head_dim * 2);
  cudaMemset(d_dqkv.get(), 0xff, qkv_n * 2);
  cudaMemset(d_lse.get(), 0xff, tokens * c.heads * 4);
  attention.forward(s, d_qkv.get(), d_o.get(), d_lse.get(), nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  attention.backward(s, d_qkv.get(), d_o.get(), d_dout.get(), d_lse.get(), d_delta.get(), d_dqkv.get(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  SCOPED_TRACE(attention.engine());
  EXPECT_LT(rel_error(gpu_test::to_float(d_o.download()), o), 1e-2);
  EXPECT_LT(rel_error(d_lse.download(), lse), 1e-4);
  EXPECT_LT(rel_error(gpu_test::to_float(d_dqkv.download()), dqkv), 2e-2);
  std::printf("attention %dx%d h%d g%d d%d%s: %s\n", c.batch, c.seq, c.heads, c.groups, c.head_dim,
              c.causal ? " causal" : "", attention.engine().c_str());

  // V read from the projection's grouped layout (per token, per group: its q heads, k, v) and dV written there,
  // where the engine does so: the attention layout's v slots then hold NaN garbage and must stay unread and
  // unwritten. The projection's other slots hold garbage too.
  if (!attention.reads_v_from_projection(s)) return;
  const int slots = c.heads + 2 * c.groups, per = c.heads / c.groups, D = c.head_dim;
  std::vector<bf16> qkv_no_v(qkv), proj(qkv_n, __float2bfloat16(NAN));
  for (std::size_t t = 0; t < tokens; ++t)
    for (int g = 0; g < c.groups; ++g)
      for (int i = 0; i < D; ++i) {
        const std::size_t at = (t * slots + c.heads + c.groups + g) * D + i;
        const std::size_t in = (t * slots + g * (per + 2) + per + 1) * D + i;
        proj[in] = qkv[at];
        qkv_no_v[at] = __float2bfloat16(NAN);
      }
  DeviceVec<bf16> d_qkv_no_v(qkv_no_v), d_proj(proj), d_dproj(qkv_n);
  cudaMemset(d_o.get(), 0xff, tokens * c.heads * c.head_dim * 2);
  cudaMemset(d_dqkv.get(), 0xff, qkv_n * 2);
  cudaMemset(d_dproj.get(), 0xff, qkv_n * 2);
  attention.forward(s, d_qkv_no_v.get(), d_proj.get(), d_o.get(), d_lse.get(), nullptr);
  attention.backward(s, d_qkv_no_v.get(), d_proj.get(), d_o.get(), d_dout.get(), d_lse.get(), d_delta.get(),
                     d_dqkv.get(), d_dproj.get(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LT(rel_error(gpu_test::to_float(d_o.download()), o), 1e-2);
  // dq, dk from the attention layout, dv from the projection's v slots, into the reference's layout.
  auto got = gpu_test::to_float(d_dqkv.download());
  const auto got_proj = gpu_test::to_float(d_dproj.download());
  for (std::size_t t = 0; t < tokens; ++t)
    for (int g = 0; g < c.groups; ++g)
      for (int i = 0; i < D; ++i) {
        const std::size_t at = (t * slots + c.heads + c.groups + g) * D + i;
        const std::size_t in = (t * slots + g * (per + 2) + per + 1) * D + i;
        EXPECT_TRUE(std::isnan(got[at])) << "the attention layout's dv slot was written";
        got[at] = got_proj[in];
      }
  EXPECT_LT(rel_error(got, dqkv), 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttentionCase{2, 100, 4, 2, 64, false}, AttentionCase{2, 100, 4, 2, 64, true},
                                           AttentionCase{1, 130, 2, 1, 128, false},
                                           AttentionCase{1, 130, 2, 2, 128, true},
                                           AttentionCase{2, 40, 4, 2, 16, true}, AttentionCase{1, 64, 2, 1, 32, false},
                                           AttentionCase{3, 100, 4, 2, 32, true}, AttentionCase{3, 99, 4, 2, 32, false}));

TEST(CrossEntropy, LossAndGradientOverTheRealVocabulary) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int rows = 7, vocab = 1000, ld = 1024;
  std::mt19937 rng(5);
  std::vector<float> x;
  auto logits = gpu_test::random_bf16(std::size_t(rows) * ld, rng, 3.0f, x);
  std::vector<int> labels(rows);
  std::vector<float> w(rows);
  for (int r = 0; r < rows; ++r) labels[r] = int(rng() % vocab), w[r] = r == 3 ? 0.0f : 0.1f * (r + 1);
  DeviceVec<bf16> d_logits(logits);
  DeviceVec<int> d_labels(labels);
  DeviceVec<float> d_w(w), d_loss(rows);
  cross_entropy_forward_backward(d_logits.get(), ld, d_labels.get(), d_w.get(), d_loss.get(), rows, vocab, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<double> loss(rows), grad(std::size_t(rows) * ld, 0.0);
  for (int r = 0; r < rows; ++r) {
    const float* row = x.data() + std::size_t(r) * ld;
    double mx = -1e300, sum = 0;
    for (int v = 0; v < vocab; ++v) mx = std::max(mx, double(row[v]));
    for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    const double lse = mx + std::log(sum);
    loss[r] = w[r] * (lse - row[labels[r]]);
    for (int v = 0; v < vocab; ++v) grad[std::size_t(r) * ld + v] = w[r] * (std::exp(row[v] - lse) - (v == labels[r]));
  }
  EXPECT_LT(rel_error(d_loss.download(), loss), 1e-5);
  auto g = gpu_test::to_float(d_logits.download());
  EXPECT_LT(rel_error(g, grad), 1e-2);
  for (int r = 0; r < rows; ++r)
    for (int v = vocab; v < ld; ++v) ASSERT_EQ(g[std::size_t(r) * ld + v], 0.0f) << "padded column " << v;
}

TEST(DiffusionNoise, BitIdenticalToTheHostObjective) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  SampleBatch s;
  s.batch = 5, s.seq = 300;
  std::mt19937 rng(9);
  for (int i = 0; i < s.batch * s.seq; ++i) {
    s.tokens.push_back(int(rng() % 5000));
    s.labels.push_back(int(rng() % 5000));
    s.loss_mask.push_back(rng() % 10 == 0 ? 0.0f : 1.0f);
  }
  s.sample_index = {0, 17, 123456789012ull, 3, 999};
  ObjectiveOptions o;
  o.mask_token = 4999, o.seed = 77, o.varilen_prob = 0;
  const ModelBatch want = make_model_batch(o, s, {});
  const int n = int(want.seq);
  std::vector<int> clean(std::size_t(s.batch) * n);
  std::vector<float> mask(clean.size());
  double mask_sum = 0;
  for (int b = 0; b < s.batch; ++b)
    for (int j = 0; j < n; ++j) {
      clean[b * n + j] = s.tokens[b * s.seq + j + 1];
      mask[b * n + j] = s.loss_mask[b * s.seq + j];
      mask_sum += mask[b * n + j];
    }
  DeviceVec<int> d_clean(clean), d_ids(clean.size());
  DeviceVec<float> d_mask(mask), d_w(clean.size());
  DeviceVec<std::uint64_t> d_index(s.sample_index);
  DeviceVec<std::uint8_t> d_masked(clean.size());
  diffusion_noise(d_clean.get(), d_mask.get(), d_index.get(), int(s.batch), n, o.seed, o.mask_token, mask_sum,
                  d_ids.get(), d_w.get(), d_masked.get(), nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(d_ids.download(), want.input_ids);
  EXPECT_EQ(d_masked.download(), want.masked);
  EXPECT_EQ(d_w.download(), want.weights);
}

// The master weights as their halves (master_split.h): the update of the joined fp32 value, split again; a
// tensor with an fp32 output (the norms') gets the same value there.
TEST(AdamW, MatchesTheHostOptimizerWithClipping) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::vector<std::int64_t> sizes = {1000, 37, 70000, 2 * kAdamWChunk + 5};
  std::vector<std::vector<float>> p(sizes.size()), g(sizes.size());
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::int64_t i = 0; i < sizes[t]; ++i) p[t].push_back(dist(rng)), g[t].push_back(dist(rng));
  std::vector<std::unique_ptr<DeviceVec<std::uint16_t>>> dhi;
  std::vector<std::unique_ptr<DeviceVec<std::int16_t>>> dlo;
  std::vector<std::unique_ptr<DeviceVec<float>>> dg, dm, dv, df32;
  std::vector<AdamWTensor> list;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    std::vector<std::uint16_t> hi;
    std::vector<std::int16_t> lo;
    for (float x : p[t]) {
      const MasterHalves h = split_master_bits(std::bit_cast<std::uint32_t>(x));
      hi.push_back(h.hi), lo.push_back(h.lo);
    }
    dhi.push_back(std::make_unique<DeviceVec<std::uint16_t>>(hi));
    dlo.push_back(std::make_unique<DeviceVec<std::int16_t>>(lo));
    dg.push_back(std::make_unique<DeviceVec<float>>(g[t]));
    dm.push_back(std::make_unique<DeviceVec<float>>(std::vector<float>(p[t].size(), 0.0f)));
    dv.push_back(std::make_unique<DeviceVec<float>>(std::vector<float>(p[t].size(), 0.0f)));
    df32.push_back(std::make_unique<DeviceVec<float>>(std::vector<float>(p[t].size(), 0.0f)));
    list.push_back({reinterpret_cast<bf16*>(dhi[t]->get()), dlo[t]->get(), t == 1 ? df32[t]->get() : nullptr,
                    dg[t]->get(), dm[t]->get(), dv[t]->get(), sizes[t], t == 1 ? 0.0f : 0.1f});
  }
  DeviceVec<AdamWTensor> d_list(list);
  const std::vector<AdamWChunk> chunks = adamw_chunks(list.data(), static_cast<int>(list.size()));
  const int n = static_cast<int>(chunks.size());
  DeviceVec<AdamWChunk> d_chunks(chunks);
  DeviceVec<double> partial{chunks.size()}, sumsq{1};
  AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  AdamW host(o);
  for (int step = 1; step <= 3; ++step) {
    grad_sumsq(d_list.get(), d_chunks.get(), n, partial.get(), sumsq.get(), nullptr);
    adamw_step(d_list.get(), d_chunks.get(), n, sumsq.get(), 1.0, 1e-2f, 0.9f, 0.95f, 1e-8f, step, nullptr);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<std::vector<float>> gc = g;  // the host clips in place
    std::vector<std::span<float>> spans;
    std::vector<ParamRef> refs;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      spans.emplace_back(gc[t]);
      refs.push_back({"t" + std::to_string(t), p[t], gc[t], t != 1, {}});
    }
    const double norm = clip_grad_norm(spans, 1.0);
    EXPECT_NEAR(std::sqrt(sumsq.download()[0]), norm, 1e-9 * norm);
    host.step(refs, 1e-2);
  }
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const auto hi = dhi[t]->download();
    const auto lo = dlo[t]->download();
    std::vector<float> got;
    for (std::size_t i = 0; i < hi.size(); ++i) got.push_back(std::bit_cast<float>(join_master_bits(hi[i], lo[i])));
    std::vector<double> want(p[t].begin(), p[t].end());
    EXPECT_LT(rel_error(got, want), 1e-6) << "tensor " << t;
    if (t == 1) EXPECT_EQ(df32[t]->download(), got);
  }
}

}  // namespace
}  // namespace dlm::train::cuda
