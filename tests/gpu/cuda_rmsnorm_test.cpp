// The RMSNorm forward and backward against double-precision host references, at widths that take each of its forms:
// two rows a block at a time (dim % 256 == 0 below 2048: 1024), one row a block (2048, 4096), one warp a row (128, 520):
// the bf16 residual gradient added into (dres + ds, rounded once) and written without reading it (ds alone, over
// NaN garbage), dw accumulated into (+=), and twice for the same bits (fixed-order sums).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "gpu_test_util.h"

namespace dlm::train::cuda {
namespace {

using gpu_test::DeviceVec;
using gpu_test::have_device;
using gpu_test::rel_error;

class RmsNormTest : public ::testing::TestWithParam<int> {};

TEST_P(RmsNormTest, BackwardMatchesReference) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int dim = GetParam(), rows = 1501;  // odd: the two-row form's last pass has one row
  std::mt19937 rng(static_cast<unsigned>(dim));
  std::vector<float> dy_f, s_f;
  const auto dy = gpu_test::random_bf16(std::size_t(rows) * dim, rng, 1.0f, dy_f);
  const auto s = gpu_test::random_bf16(std::size_t(rows) * dim, rng, 2.0f, s_f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(dim), dw(dim), rstd(rows), dres_f;
  for (auto& x : w) x = 1.0f + 0.1f * normal(rng);
  const auto dres = gpu_test::random_bf16(std::size_t(rows) * dim, rng, 1.0f, dres_f);
  for (auto& x : dw) x = normal(rng);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int j = 0; j < dim; ++j) ss += double(s_f[std::size_t(r) * dim + j]) * s_f[std::size_t(r) * dim + j];
    rstd[r] = static_cast<float>(1.0 / std::sqrt(ss / dim + 1e-6));
  }
  std::vector<double> ds(std::size_t(rows) * dim), want_dw(dw.begin(), dw.end());
  for (int r = 0; r < rows; ++r) {
    const double rr = rstd[r];
    double dot = 0;
    for (int j = 0; j < dim; ++j) {
      const std::size_t i = std::size_t(r) * dim + j;
      dot += double(dy_f[i]) * w[j] * s_f[i] * rr;
    }
    dot /= dim;
    for (int j = 0; j < dim; ++j) {
      const std::size_t i = std::size_t(r) * dim + j;
      const double xh = s_f[i] * rr;
      ds[i] = rr * (dy_f[i] * double(w[j]) - xh * dot);
      want_dw[j] += dy_f[i] * xh;
    }
  }
  std::vector<double> want_sum(ds.size());
  for (std::size_t i = 0; i < ds.size(); ++i) want_sum[i] = dres_f[i] + ds[i];
  DeviceVec<bf16> d_dy(dy), d_s(s), d_dres(dres);
  DeviceVec<float> d_w(w), d_rstd(rstd), d_dw(dw), partial(std::size_t(rmsnorm_partial_floats(rows, dim)));
  rmsnorm_backward(d_dy.get(), d_s.get(), d_w.get(), d_rstd.get(), d_dres.get(), true, d_dw.get(), partial.get(), rows,
                   dim, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto got_dres = d_dres.download();
  const auto got_dw = d_dw.download();
  // One bf16 rounding of the sum: relative error about 2^-9 element-wise.
  EXPECT_LT(rel_error(gpu_test::to_float(got_dres), want_sum), 4e-3) << "dim " << dim;
  EXPECT_LT(rel_error(got_dw, want_dw), 1e-5) << "dim " << dim;
  // Without accumulate, dres is written and never read: NaN bits there must not leak into the result.
  std::vector<bf16> garbage(dres.size());
  for (auto& x : garbage) x = __float2bfloat16(std::nanf(""));
  d_dres.upload(garbage);
  d_dw.upload(dw);
  rmsnorm_backward(d_dy.get(), d_s.get(), d_w.get(), d_rstd.get(), d_dres.get(), false, d_dw.get(), partial.get(), rows,
                   dim, nullptr);
  EXPECT_LT(rel_error(gpu_test::to_float(d_dres.download()), ds), 4e-3) << "dim " << dim;
  EXPECT_EQ(d_dw.download(), got_dw);
  d_dres.upload(dres);
  d_dw.upload(dw);
  rmsnorm_backward(d_dy.get(), d_s.get(), d_w.get(), d_rstd.get(), d_dres.get(), true, d_dw.get(), partial.get(), rows,
                   dim, nullptr);
  EXPECT_EQ(d_dw.download(), got_dw);
  const auto again = d_dres.download();
  ASSERT_EQ(again.size(), got_dres.size());
  EXPECT_EQ(0, std::memcmp(again.data(), got_dres.data(), again.size() * sizeof(bf16)));
}

// The forward (fused residual add, then the norm of the rounded sum) against a host reference at the same widths:
// one vector a thread from dim 256 up when dim % 256 == 0 (1024, 2048, 4096), the looping form otherwise (128, 520).
TEST_P(RmsNormTest, ForwardMatchesReference) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int dim = GetParam(), rows = 700;
  std::mt19937 rng(static_cast<unsigned>(dim) + 7u);
  std::vector<float> x_f, a_f;
  const auto x = gpu_test::random_bf16(std::size_t(rows) * dim, rng, 1.0f, x_f);
  const auto a = gpu_test::random_bf16(std::size_t(rows) * dim, rng, 0.5f, a_f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(dim);
  for (auto& v : w) v = 1.0f + 0.1f * normal(rng);
  for (const bool with_add : {true, false}) {
    // The sum the kernel normalises is rounded to bf16 first (the backward reads that rounded sum).
    std::vector<float> s_f(x_f);
    if (with_add)
      for (std::size_t i = 0; i < s_f.size(); ++i) s_f[i] = __bfloat162float(__float2bfloat16(x_f[i] + a_f[i]));
    std::vector<double> want_y(s_f.size()), want_rstd(rows);
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int j = 0; j < dim; ++j) ss += double(s_f[std::size_t(r) * dim + j]) * s_f[std::size_t(r) * dim + j];
      want_rstd[r] = 1.0 / std::sqrt(ss / dim + 1e-6);
      for (int j = 0; j < dim; ++j)
        want_y[std::size_t(r) * dim + j] = s_f[std::size_t(r) * dim + j] * want_rstd[r] * w[j];
    }
    DeviceVec<bf16> d_x(x), d_a(a), d_s(std::size_t(rows) * dim), d_y(std::size_t(rows) * dim);
    DeviceVec<float> d_w(w), d_rstd{static_cast<std::size_t>(rows)};
    rmsnorm_forward(d_x.get(), with_add ? d_a.get() : nullptr, d_s.get(), d_w.get(), d_y.get(), d_rstd.get(), rows, dim,
                    1e-6f, nullptr);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_LT(rel_error(gpu_test::to_float(d_y.download()), want_y), 4e-3) << "dim " << dim << " add " << with_add;
    EXPECT_LT(rel_error(d_rstd.download(), want_rstd), 1e-5) << "dim " << dim << " add " << with_add;
    if (with_add) {
      const auto got_s = gpu_test::to_float(d_s.download());
      EXPECT_EQ(got_s, s_f) << "dim " << dim << ": the rounded residual sum";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Widths, RmsNormTest, ::testing::Values(128, 520, 1024, 2048, 4096));

}  // namespace
}  // namespace dlm::train::cuda
