// The RMSNorm backward against a double-precision host reference, at widths that take each of its forms:
// one vector a thread (dim % 256 == 0 from 2048: 2048, 4096), one warp a row (128, 520, 1024), on fresh random inputs with
// dres and dw accumulated into (+=), and twice for the same bits (fixed-order sums).
#include <gtest/gtest.h>

#include <cmath>
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
  const int dim = GetParam(), rows = 1500;
  std::mt19937 rng(static_cast<unsigned>(dim));
  std::vector<float> dy_f, s_f;
  const auto dy = gpu_test::random_bf16(std::size_t(rows) * dim, rng, 1.0f, dy_f);
  const auto s = gpu_test::random_bf16(std::size_t(rows) * dim, rng, 2.0f, s_f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(dim), dres(std::size_t(rows) * dim), dw(dim), rstd(rows);
  for (auto& x : w) x = 1.0f + 0.1f * normal(rng);
  for (auto& x : dres) x = normal(rng);
  for (auto& x : dw) x = normal(rng);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int j = 0; j < dim; ++j) ss += double(s_f[std::size_t(r) * dim + j]) * s_f[std::size_t(r) * dim + j];
    rstd[r] = static_cast<float>(1.0 / std::sqrt(ss / dim + 1e-6));
  }
  std::vector<double> want_dres(dres.begin(), dres.end()), want_dw(dw.begin(), dw.end());
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
      want_dres[i] += rr * (dy_f[i] * double(w[j]) - xh * dot);
      want_dw[j] += dy_f[i] * xh;
    }
  }
  DeviceVec<bf16> d_dy(dy), d_s(s), d_db(std::size_t(rows) * dim);
  DeviceVec<float> d_w(w), d_rstd(rstd), d_dres(dres), d_dw(dw), partial(std::size_t(rmsnorm_partial_floats(rows, dim)));
  rmsnorm_backward(d_dy.get(), d_s.get(), d_w.get(), d_rstd.get(), d_dres.get(), d_db.get(), d_dw.get(), partial.get(),
                   rows, dim, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto got_dres = d_dres.download(), got_dw = d_dw.download();
  EXPECT_LT(rel_error(got_dres, want_dres), 1e-6) << "dim " << dim;
  EXPECT_LT(rel_error(got_dw, want_dw), 1e-5) << "dim " << dim;
  const auto got_db = gpu_test::to_float(d_db.download());
  EXPECT_LT(rel_error(got_db, want_dres), 5e-3) << "dim " << dim;
  d_dres.upload(dres);
  d_dw.upload(dw);
  rmsnorm_backward(d_dy.get(), d_s.get(), d_w.get(), d_rstd.get(), d_dres.get(), d_db.get(), d_dw.get(), partial.get(),
                   rows, dim, nullptr);
  EXPECT_EQ(d_dw.download(), got_dw);
  EXPECT_EQ(d_dres.download(), got_dres);
}

INSTANTIATE_TEST_SUITE_P(Widths, RmsNormTest, ::testing::Values(128, 520, 1024, 2048, 4096));

}  // namespace
}  // namespace dlm::train::cuda
