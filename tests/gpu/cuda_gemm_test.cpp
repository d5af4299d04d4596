// Gemm (gemm.h) with tuning: shapes large enough to be tuned give the product a double-precision reference gives,
// in bf16 and in fp32 with beta 1 adding to what C holds (a tuned shape's first call that adds uses the heuristic's
// choice, its first that overwrites times the candidates on its own operands), the same as with tuning off; so does
// a skinny shape (few rows over a large weight), whose candidates include split-K variants.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/gemm.h"
#include "gpu_test_util.h"

namespace dlm::train::cuda {
namespace {

using gpu_test::DeviceVec;

// C[m, n] = A[m, k] B[n, k]^T in double.
std::vector<double> reference(const std::vector<float>& a, const std::vector<float>& b, int m, int n, int k) {
  std::vector<double> c(static_cast<std::size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) s += double(a[std::size_t(i) * k + p]) * b[std::size_t(j) * k + p];
      c[std::size_t(i) * n + j] = s;
    }
  return c;
}

// C = A B^T of an m x n x k shape, tuned and untuned, against the reference on its first `rows` rows.
void expect_reference_product(int m, int n, int k, int rows) {
  std::mt19937 rng(3);
  std::vector<float> af, bf;
  const auto a16 = gpu_test::random_bf16(std::size_t(m) * k, rng, 1.0f, af);
  const auto b16 = gpu_test::random_bf16(std::size_t(n) * k, rng, 1.0f, bf);
  const DeviceVec<bf16> a(a16), b(b16);
  const auto want = reference(std::vector<float>(af.begin(), af.begin() + std::size_t(rows) * k), bf, rows, n, k);
  for (const bool tune : {true, false}) {  // false: the deterministic mode's GEMMs (the heuristic's choice)
    Gemm gemm(tune);
    EXPECT_EQ(gemm.tunes(), tune);
    // bf16 out, overwriting (tuned at this call).
    DeviceVec<bf16> c16(std::size_t(m) * n);
    gemm.run(false, true, m, n, k, a.get(), k, b.get(), k, c16.get(), false, n, 0.0f, nullptr);
    const auto got16 = gpu_test::to_float(c16.download());
    // fp32 out: a first call that adds (beta 1, onto ones), then one that overwrites (tuned here), then one that adds.
    DeviceVec<float> c32(std::vector<float>(std::size_t(m) * n, 1.0f));
    gemm.run(false, true, m, n, k, a.get(), k, b.get(), k, c32.get(), true, n, 1.0f, nullptr);
    const auto added = c32.download();
    gemm.run(false, true, m, n, k, a.get(), k, b.get(), k, c32.get(), true, n, 0.0f, nullptr);
    gemm.run(false, true, m, n, k, a.get(), k, b.get(), k, c32.get(), true, n, 1.0f, nullptr);
    const auto twice = c32.download();
    double worst16 = 0, worst_added = 0, worst_twice = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double scale = std::sqrt(double(k));  // |C| ~ sqrt(k) for unit-variance operands
      worst16 = std::max(worst16, std::abs(got16[i] - want[i]) / scale);
      worst_added = std::max(worst_added, std::abs(added[i] - (want[i] + 1.0)) / scale);
      worst_twice = std::max(worst_twice, std::abs(twice[i] - 2.0 * want[i]) / scale);
    }
    // bf16 output: half an ulp of |C| <= ~5 sqrt(k) is 2^-9 of 256, 0.5, which is 0.011 of the scale.
    EXPECT_LT(worst16, 2e-2) << "tune " << tune;
    EXPECT_LT(worst_added, 1e-4) << "tune " << tune;
    EXPECT_LT(worst_twice, 1e-4) << "tune " << tune;
  }
}

TEST(Gemm, TunedShapesMatchTheReference) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  // 2 m n k = 1.7e10 >= kTuneFlops: tuned. Rows checked: a sample (the reference is O(m n k) on the host).
  ASSERT_GE(2.0 * 2048 * 2048 * 2048, Gemm::kTuneFlops);
  expect_reference_product(2048, 2048, 2048, 64);
}

TEST(Gemm, SkinnyShapesMatchTheReference) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  // 32 rows over a 4096 x 2048 weight (16 MiB): below kTuneFlops, above kTuneElements, so tuned as a skinny shape
  // (split-K candidates, cold L2).
  const int m = 32, n = 4096, k = 2048;
  ASSERT_LT(2.0 * m * n * k, Gemm::kTuneFlops);
  ASSERT_GE(double(m) * k + double(n) * k, Gemm::kTuneElements);
  expect_reference_product(m, n, k, m);
}

}  // namespace
}  // namespace dlm::train::cuda
