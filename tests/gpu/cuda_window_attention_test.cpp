// window_attention (kv_cache.cu), the block KV cache's attention of a window of columns over the store, against a
// double-precision host reference: windows at the start, middle and end of the sequence, one column wide to the
// whole sequence, widths and sequences off the kernel's tiles (16 queries, 64 keys), MHA and GQA, head dims 16 to
// 128, batches of 1 to 3, and every query tiling (1, 2 and 4 warps of queries, the keys split 4, 2 and 1 ways), each
// with its key tiles in one block, split over 2, 3 and up to 8 blocks (one thread-block cluster, which merges them)
// and split as CudaModel chooses.
// The inputs hold NaN wherever the kernel must not read: the store at the window's own columns, V in the attention
// layout, every slot but V in the projection layout; the output is poisoned before the call. The output's amax (FP8
// sampling's projection input scale) is taken as it is written: the largest |value| of what the call wrote; its FP8
// cast (a window step's, with the slot's scale as it stands) is fp8_quantize's of the bf16 output, bit for bit, also
// as the cast alone (Fp8Out::amax off) without the bf16 output, which leaves the slot as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cuda/fp8_cast.h"
#include "backend/cuda/kernels.h"
#include "gpu_test_util.h"

namespace dlm::train::cuda {
namespace {

using gpu_test::DeviceVec;
using gpu_test::have_device;
using gpu_test::rel_error;

struct WindowCase {
  int batch, seq, heads, groups, head_dim, first, width;
};

class WindowAttentionTest : public ::testing::TestWithParam<WindowCase> {};

TEST_P(WindowAttentionTest, MatchesReferenceAtEveryQueryTiling) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const WindowCase c = GetParam();
  const int D = c.head_dim, H = c.heads, G = c.groups, per = H / G, slots = H + 2 * G;
  const std::size_t rows = std::size_t(c.batch) * c.width, row_n = std::size_t(slots) * D;
  std::mt19937 rng(static_cast<unsigned>(c.seq * 131 + c.first * 7 + c.width + D));
  std::vector<float> rot_f, raw_f, k_f, v_f;
  auto rot = gpu_test::random_bf16(rows * row_n, rng, 1.0f, rot_f);
  auto raw = gpu_test::random_bf16(rows * row_n, rng, 1.0f, raw_f);
  const std::size_t store_n = std::size_t(c.batch) * c.seq * G * D;
  auto k_store = gpu_test::random_bf16(store_n, rng, 1.0f, k_f);
  auto v_store = gpu_test::random_bf16(store_n, rng, 1.0f, v_f);
  const bf16 nan = __float2bfloat16(NAN);
  const auto v_raw = [&](std::size_t row, int g) { return row * row_n + std::size_t(g * (per + 2) + per + 1) * D; };
  std::vector<bool> is_v(row_n, false);  // a projection row's V slots
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < D; ++i) is_v[v_raw(0, g) + i] = true;
  for (std::size_t r = 0; r < rows; ++r) {
    for (int n = H + G; n < slots; ++n)
      for (int i = 0; i < D; ++i) rot[r * row_n + std::size_t(n) * D + i] = nan;  // V of the attention layout
    for (std::size_t i = 0; i < row_n; ++i)
      if (!is_v[i]) raw[r * row_n + i] = nan;
  }
  const auto store_at = [&](int b, int col, int g) { return (std::size_t(b * c.seq + col) * G + g) * D; };
  for (int b = 0; b < c.batch; ++b)
    for (int col = c.first; col < c.first + c.width; ++col)
      for (int g = 0; g < G; ++g)
        for (int i = 0; i < D; ++i) k_store[store_at(b, col, g) + i] = v_store[store_at(b, col, g) + i] = nan;

  // o[b, j, h] = softmax_c(q . K[c] / sqrt(D)) V, K and V the window's own inside it, the store's elsewhere.
  std::vector<double> want(rows * H * D, 0.0);
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> p(c.seq);
  for (int b = 0; b < c.batch; ++b)
    for (int j = 0; j < c.width; ++j)
      for (int h = 0; h < H; ++h) {
        const int g = h / per;
        const std::size_t qrow = std::size_t(b * c.width + j);
        const auto key = [&](int col, int i) {
          const bool own = col >= c.first && col < c.first + c.width;
          const std::size_t r = std::size_t(b * c.width + col - c.first);
          return own ? double(rot_f[r * row_n + std::size_t(H + g) * D + i]) : double(k_f[store_at(b, col, g) + i]);
        };
        const auto value = [&](int col, int i) {
          const bool own = col >= c.first && col < c.first + c.width;
          const std::size_t r = std::size_t(b * c.width + col - c.first);
          return own ? double(raw_f[v_raw(r, g) + i]) : double(v_f[store_at(b, col, g) + i]);
        };
        double mx = -1e300;
        for (int col = 0; col < c.seq; ++col) {
          double s = 0;
          for (int i = 0; i < D; ++i) s += double(rot_f[qrow * row_n + std::size_t(h) * D + i]) * key(col, i);
          p[col] = s * scale, mx = std::max(mx, p[col]);
        }
        double sum = 0;
        for (int col = 0; col < c.seq; ++col) sum += p[col] = std::exp(p[col] - mx);
        double* o = want.data() + (qrow * H + h) * D;
        for (int col = 0; col < c.seq; ++col)
          for (int i = 0; i < D; ++i) o[i] += p[col] / sum * value(col, i);
      }

  DeviceVec<bf16> d_rot(rot), d_raw(raw), d_k(k_store), d_v(v_store), d_out(rows * H * D);
  DeviceVec<int> d_first(std::vector<int>{c.first});
  const WindowAttentionShape s{c.batch, c.seq, H, G, D, c.width};
  // Scale 2.5: the cast's arithmetic shows (the outputs are below 1, far from saturating).
  const Fp8Slot slot0{.scale_inv = 0.4f, .amax = 0, .scale = 2.5f, .fp8_max = 448};
  DeviceVec<Fp8Slot> d_slot(std::vector<Fp8Slot>{slot0}), d_ref_slot(std::vector<Fp8Slot>{slot0});
  DeviceVec<fp8> d_out8(rows * H * D), d_ref8(rows * H * D);
  for (int query_warps : {1, 2, 4})
    for (int key_splits : {1, 2, 3, 8, 0}) {
      cudaMemset(d_out.get(), 0xff, rows * H * D * sizeof(bf16));  // NaN unless written
      cudaMemset(&d_slot.get()->amax, 0, sizeof(float));
      cudaMemset(d_out8.get(), 0xff, rows * H * D);
      const Fp8Out out8{d_out8.get(), d_slot.get(), false};
      window_attention(s, d_first.get(), d_rot.get(), d_raw.get(), d_k.get(), d_v.get(), d_out.get(), nullptr,
                       query_warps, key_splits, &out8);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      const auto got = gpu_test::to_float(d_out.download());
      float amax = 0;
      for (float v : got) amax = std::max(amax, std::abs(v));
      const Fp8Slot after = d_slot.download()[0];
      EXPECT_EQ(after.amax, amax) << "query warps " << query_warps << ", key splits " << key_splits;
      EXPECT_EQ(after.scale, 2.5f);
      EXPECT_EQ(after.scale_inv, 0.4f);
      fp8_quantize(d_out.get(), static_cast<int>(rows), H * D, {d_ref_slot.get(), false, false, 1.0f}, d_ref8.get(),
                   nullptr, nullptr);
      ASSERT_EQ(d_out8.download(), d_ref8.download())
          << "query warps " << query_warps << ", key splits " << key_splits;
      // The cast alone (a KV-cache window's stored scales) and no bf16 output: the same bytes, the slot left as it
      // was.
      const Fp8Slot poisoned{.scale_inv = 7.0f, .amax = 123.0f, .scale = 2.5f, .fp8_max = 448};
      cudaMemcpy(d_slot.get(), &poisoned, sizeof(Fp8Slot), cudaMemcpyHostToDevice);
      cudaMemset(d_out8.get(), 0xff, rows * H * D);
      const Fp8Out cast_only{d_out8.get(), d_slot.get(), false, false};
      window_attention(s, d_first.get(), d_rot.get(), d_raw.get(), d_k.get(), d_v.get(), nullptr, nullptr,
                       query_warps, key_splits, &cast_only);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      ASSERT_EQ(d_out8.download(), d_ref8.download()) << "cast only, query warps " << query_warps;
      const Fp8Slot untouched = d_slot.download()[0];
      EXPECT_EQ(untouched.amax, 123.0f);
      EXPECT_EQ(untouched.scale_inv, 7.0f);
      const double err = rel_error(got, want);
      std::printf("[kv window attention] %dx%d h%d g%d d%d window [%d, %d) query warps %d key splits %d: rel error "
                  "%.2e\n", c.batch, c.seq, H, G, D, c.first, c.first + c.width, query_warps, key_splits, err);
      EXPECT_LT(err, 1e-2) << "query warps " << query_warps << ", key splits " << key_splits;
      // Row by row too: one wrong row of many would hide in the norm.
      for (std::size_t r = 0; r < rows * H; ++r) {
        const std::vector<float> row(got.begin() + r * D, got.begin() + (r + 1) * D);
        const std::vector<double> ref(want.begin() + r * D, want.begin() + (r + 1) * D);
        ASSERT_LT(rel_error(row, ref), 3e-2) << "query warps " << query_warps << ", key splits " << key_splits
                                             << ", output row " << r / H << " head " << r % H;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Windows, WindowAttentionTest,
    ::testing::Values(WindowCase{1, 320, 4, 4, 128, 64, 32},   // a dual-cache block: MHA, mid-sequence
                      WindowCase{1, 320, 4, 4, 128, 96, 224},  // a prefix-cache window: block and suffix
                      WindowCase{2, 100, 4, 2, 64, 0, 37},     // GQA, at the start, off the query tile
                      WindowCase{3, 77, 8, 2, 32, 60, 17},     // four heads a group, at the end, off the key tile
                      WindowCase{2, 40, 4, 2, 16, 39, 1},      // one column
                      WindowCase{1, 130, 2, 1, 128, 0, 130},   // the whole sequence: no store column
                      WindowCase{2, 200, 4, 2, 64, 150, 50},
                      WindowCase{1, 20, 4, 2, 32, 4, 8}));     // fewer keys than a tile: idle key slices

}  // namespace
}  // namespace dlm::train::cuda
