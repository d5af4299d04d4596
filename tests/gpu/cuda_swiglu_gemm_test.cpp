// The fc2 data GEMM with SwiGLU's backward fused (swiglu_gemm.cu) against a double-precision host reference and
// against the unfused pair it replaces (cuBLASLt GEMM, then swiglu_backward), on fresh random inputs at a shape
// no tile divides (1000 tokens, hidden 256, ffn 360): both halves of dgu, twice for the same bits, and the
// shapes it must refuse (rows not 16-byte aligned) leaving the output untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/swiglu_gemm.h"
#include "gpu_test_util.h"

namespace dlm::train::cuda {
namespace {

using gpu_test::DeviceVec;
using gpu_test::have_device;
using gpu_test::rel_error;

TEST(SwigluBackwardGemm, MatchesReferenceAndUnfusedPair) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  SwigluBackwardGemm fused;
  if (!fused.available()) GTEST_SKIP() << "no fused kernel in this build or on this GPU (CUTLASS, compute 9.0)";
  const int T = 1000, d = 256, F = 360;
  std::mt19937 rng(7);
  std::vector<float> dy_f, w_f, gu_f;
  const auto dy = gpu_test::random_bf16(std::size_t(T) * d, rng, 1.0f, dy_f);
  const auto w = gpu_test::random_bf16(std::size_t(d) * F, rng, 0.05f, w_f);
  const auto gu = gpu_test::random_bf16(std::size_t(T) * 2 * F, rng, 2.0f, gu_f);
  std::vector<double> want(std::size_t(T) * 2 * F);
  for (int t = 0; t < T; ++t)
    for (int f = 0; f < F; ++f) {
      double dh = 0;
      for (int k = 0; k < d; ++k) dh += double{dy_f[std::size_t(t) * d + k]} * w_f[std::size_t(k) * F + f];
      const double g = gu_f[std::size_t(t) * 2 * F + f], u = gu_f[std::size_t(t) * 2 * F + F + f];
      const double s = 1.0 / (1.0 + std::exp(-g));
      want[std::size_t(t) * 2 * F + f] = dh * u * s * (1.0 + g * (1.0 - s));
      want[std::size_t(t) * 2 * F + F + f] = dh * g * s;
    }
  DeviceVec<bf16> d_dy(dy), d_w(w), d_gu(gu), d_dgu(std::size_t(T) * 2 * F), d_dh(std::size_t(T) * F);
  ASSERT_TRUE(fused.run(d_dy.get(), d_w.get(), d_gu.get(), d_dgu.get(), T, d, F, nullptr));
  const auto got = d_dgu.download();
  const double fused_error = rel_error(gpu_test::to_float(got), want);
  EXPECT_LT(fused_error, 5e-3);
  // Each half on its own (a swapped or misplaced half would hide in the whole's norm only partly).
  std::vector<float> got_up, got_gate;
  std::vector<double> want_up, want_gate;
  for (int t = 0; t < T; ++t)
    for (int f = 0; f < 2 * F; ++f) {
      const std::size_t i = std::size_t(t) * 2 * F + f;
      (f < F ? got_gate : got_up).push_back(__bfloat162float(got[i]));
      (f < F ? want_gate : want_up).push_back(want[i]);
    }
  EXPECT_LT(rel_error(got_gate, want_gate), 5e-3);
  EXPECT_LT(rel_error(got_up, want_up), 5e-3);

  Gemm gemm;
  gemm.run(false, false, T, F, d, d_dy.get(), d, d_w.get(), F, d_dh.get(), false, F, 0.0f, nullptr);
  DeviceVec<bf16> unfused(std::size_t(T) * 2 * F);
  swiglu_backward(d_dh.get(), d_gu.get(), unfused.get(), T, F, nullptr);
  const double unfused_error = rel_error(gpu_test::to_float(unfused.download()), want);
  // The fused form skips dh's rounding to bf16: never less accurate than the pair.
  EXPECT_LE(fused_error, unfused_error * 1.05) << "fused " << fused_error << " unfused " << unfused_error;

  ASSERT_TRUE(fused.run(d_dy.get(), d_w.get(), d_gu.get(), d_dgu.get(), T, d, F, nullptr));
  const auto again = d_dgu.download();
  EXPECT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * sizeof(bf16)));
}

TEST(SwigluBackwardGemm, RefusesUnalignedRows) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  SwigluBackwardGemm fused;
  if (!fused.available()) GTEST_SKIP() << "no fused kernel in this build or on this GPU";
  DeviceVec<bf16> a(64 * 64), b(64 * 64), gu(64 * 2 * 64), dgu(64 * 2 * 64);
  EXPECT_FALSE(fused.run(a.get(), b.get(), gu.get(), dgu.get(), 64, 64, 60, nullptr));  // ffn % 8 != 0
  EXPECT_FALSE(fused.run(a.get(), b.get(), gu.get(), dgu.get(), 64, 60, 64, nullptr));  // hidden % 8 != 0
  EXPECT_FALSE(fused.run(a.get() + 1, b.get(), gu.get(), dgu.get(), 64, 64, 64, nullptr));  // misaligned pointer
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace dlm::train::cuda
