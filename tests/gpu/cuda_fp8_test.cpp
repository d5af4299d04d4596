// FP8 on the device (backend/cuda/fp8_cast.h, Gemm::run_fp8): the GEMMs of a linear layer's forward and backward
// (the weight's and the activations' transposed casts) against double references, the delayed recipe's scale
// updates against the host's AmaxHistory, saturating casts on outliers, and the casts and amaxes fused into RMSNorm
// and SwiGLU (forward and backward, and SwiGLU straight into FP8 both ways, delayed and after an amax pass) against
// the separate cast; the samplers' skinny FP8 GEMMs at any row count. Training's casts and GEMMs run at row counts
// that are not multiples of 16 too (30, 46, 2047: difflm-noshift's seq - 1 positions a sequence): the transposed
// operands padded to fp8_padded_rows with zeros, the row-major ones untouched past their rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/fp8_cast.h"
#include "backend/cuda/gemm.h"
#include "dlm/train/fp8.h"
#include "gpu_test_util.h"

namespace dlm::train::cuda {
namespace {

using gpu_test::DeviceVec;

// Fresh slots: amax 0, scale 1 (Transformer Engine's initial scale; the first slot's may be given), the format's max.
DeviceVec<Fp8Slot> slots(const std::vector<float>& maxima, float first_scale = 1.0f) {
  std::vector<Fp8Slot> s;
  for (float m : maxima) s.push_back({.scale_inv = 1.0f, .amax = 0.0f, .scale = s.empty() ? first_scale : 1.0f, .fp8_max = m});
  return DeviceVec<Fp8Slot>(s);
}
// Tensorwise: the tensor's own amax, then the cast with the scale derived from it.
void cast_current(const bf16* x, int rows, int cols, Fp8Slot* slot, bool e5m2, fp8* out, fp8* out_t) {
  ASSERT_EQ(cudaMemset(&slot->amax, 0, sizeof(float)), cudaSuccess);
  fp8_amax(x, std::int64_t{rows} * cols, slot, nullptr);
  fp8_quantize(x, rows, cols, {slot, e5m2, true, 1.0f}, out, out_t, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}
Fp8Slot read_slot(const Fp8Slot* slot) {
  Fp8Slot s{};
  EXPECT_EQ(cudaMemcpy(&s, slot, sizeof s, cudaMemcpyDeviceToHost), cudaSuccess);
  return s;
}
std::vector<float> dequantize(const DeviceVec<fp8>& q, std::size_t n, bool e5m2, const Fp8Slot* slot) {
  DeviceVec<float> out(n);
  fp8_dequantize(q.get(), static_cast<std::int64_t>(n), e5m2, slot, out.get(), nullptr);
  return out.download();
}
// C[m, n] = A[m, k] B[n, k]^T in double (row-major, K contiguous).
std::vector<double> nt_product(const std::vector<float>& a, const std::vector<float>& b, int m, int n, int k) {
  std::vector<double> c(static_cast<std::size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) s += double{a[std::size_t(i) * k + p]} * b[std::size_t(j) * k + p];
      c[std::size_t(i) * n + j] = s;
    }
  return c;
}
std::vector<float> transpose(const std::vector<float>& a, int rows, int cols) {
  std::vector<float> t(a.size());
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) t[std::size_t(j) * rows + i] = a[std::size_t(i) * cols + j];
  return t;
}

// How many bytes of a and b differ (sizes equal): a failure names the count, not two dumps.
std::size_t differing(const std::vector<fp8>& a, const std::vector<fp8>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::size_t n = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += a[i] != b[i];
  return n;
}

// An FP8 output buffer of n bytes, every byte kSentinel: a kernel's writes show against it.
constexpr fp8 kSentinel = 0x5a;
DeviceVec<fp8> sentinel_fp8(std::size_t n) { return DeviceVec<fp8>(std::vector<fp8>(n, kSentinel)); }

// A cast's two layouts of [rows, cols], both from sentinel_fp8 buffers of padded rows: out_t [cols, Tp] is out
// transposed with columns [rows, Tp) zero (Tp = fp8_padded_rows(rows)), and out's rows past `rows` are unwritten.
void expect_layouts(const std::vector<fp8>& out, const std::vector<fp8>& out_t, int rows, int cols, const char* what) {
  const auto tp = static_cast<int>(fp8_padded_rows(rows));
  ASSERT_EQ(out.size(), std::size_t(tp) * cols) << what;
  ASSERT_EQ(out_t.size(), std::size_t(tp) * cols) << what;
  std::size_t wrong = 0, pad_nonzero = 0, past_written = 0;
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < tp; ++r) {
      const fp8 t = out_t[std::size_t(c) * tp + r];
      if (r < rows) wrong += t != out[std::size_t(r) * cols + c];
      else pad_nonzero += t != 0, past_written += out[std::size_t(r) * cols + c] != kSentinel;
    }
  EXPECT_EQ(wrong, 0u) << what << ": the transposed cast is not the row-major one transposed";
  EXPECT_EQ(pad_nonzero, 0u) << what << ": the transposed operand's pad columns are not zero";
  EXPECT_EQ(past_written, 0u) << what << ": rows past the tensor's were written";
}

// A fused cast's two layouts (fused, fused_t) are the separate cast's byte for byte, and laid out as expect_layouts
// says.
void expect_same_casts(const DeviceVec<fp8>& fused, const DeviceVec<fp8>& fused_t, const DeviceVec<fp8>& separate,
                       const DeviceVec<fp8>& separate_t, int rows, int cols, const std::string& what) {
  const auto f = fused.download(), ft = fused_t.download();
  EXPECT_EQ(differing(f, separate.download()), 0u) << what << ", row-major";
  EXPECT_EQ(differing(ft, separate_t.download()), 0u) << what << ", transposed";
  expect_layouts(f, ft, rows, cols, what.c_str());
}

struct LinearShape {
  int tokens, in, out;
};

// A linear layer y = x W^T in FP8 and its backward dx = dy W, dW += dy^T x, each GEMM in the "TN" form Hopper's FP8
// kernels take: W^T, dy^T and x^T come from the transposed casts. Two references: the product of the dequantized
// operands (the GEMM's own error: fp32 accumulation and the output's rounding, bf16 ~2^-9 relative) and the product
// of the bf16 operands (the FP8 error budget: each operand's rounding, up to 2^-4 relative for e4m3 and 2^-3 for e5m2;
// over k random terms the product's norm-wise error is the operands' rms relative errors added in quadrature, about
// 0.04 for e4m3 x e4m3 and 0.065 with e5m2: bounded by 0.06 and 0.09, and at least 0.01, which bf16 would not reach).
// Any token count: the weight gradient's K is the count padded to 16 (fp8_padded_rows), over x^T and dy^T whose pad
// columns the transposed casts write zero; the forward and the input gradient take the count as M.
TEST(Fp8Gemm, LinearLayerForwardAndBackwardMatchTheReferences) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  for (const auto shape : {LinearShape{128, 256, 384}, LinearShape{48, 80, 160}, LinearShape{256, 512, 256},
                           LinearShape{30, 80, 160}, LinearShape{46, 256, 384}, LinearShape{2047, 256, 128}})
    for (const bool hybrid : {true, false}) {
      SCOPED_TRACE(testing::Message() << shape.tokens << "x" << shape.in << "x" << shape.out << (hybrid ? " hybrid" : " e4m3"));
      const int T = shape.tokens, in = shape.in, out = shape.out, Tp = static_cast<int>(fp8_padded_rows(T));
      ASSERT_TRUE(Gemm::fp8_gemm_fits(T, out, in, in, in, out));
      ASSERT_TRUE(Gemm::fp8_gemm_fits(out, in, Tp, Tp, Tp, in));
      std::mt19937 rng(11);
      std::vector<float> xf, wf, dyf;
      // Magnitudes far from 1 in both directions: the scales, not the formats' ranges, must carry them.
      const DeviceVec<bf16> x(gpu_test::random_bf16(std::size_t(T) * in, rng, 3.0f, xf));
      const DeviceVec<bf16> w(gpu_test::random_bf16(std::size_t(out) * in, rng, 0.02f, wf));
      const DeviceVec<bf16> dy(gpu_test::random_bf16(std::size_t(T) * out, rng, 1e-4f, dyf));
      const float gmax = hybrid ? kFp8E5m2Max : kFp8E4m3Max;
      auto s = slots({kFp8E4m3Max, kFp8E4m3Max, gmax, kFp8E4m3Max});  // x, W, dy, x (transposed)
      Fp8Slot *sx = s.get(), *sw = s.get() + 1, *sdy = s.get() + 2, *sxt = s.get() + 3;
      // x and dy row-major with room for Tp rows (sentinels past T), x^T [in, Tp] and dy^T [out, Tp].
      DeviceVec<fp8> x8 = sentinel_fp8(std::size_t(Tp) * in), xt8 = sentinel_fp8(std::size_t(Tp) * in),
                     dy8 = sentinel_fp8(std::size_t(Tp) * out), dyt8 = sentinel_fp8(std::size_t(Tp) * out);
      DeviceVec<fp8> w8(wf.size()), wt8(wf.size());
      cast_current(x.get(), T, in, sx, false, x8.get(), nullptr);
      cast_current(w.get(), out, in, sw, false, w8.get(), wt8.get());
      cast_current(dy.get(), T, out, sdy, hybrid, dy8.get(), dyt8.get());
      cast_current(x.get(), T, in, sxt, false, nullptr, xt8.get());
      Gemm gemm(true);
      DeviceVec<bf16> y(std::size_t(T) * out), dx(std::size_t(T) * in);
      DeviceVec<float> dw(std::vector<float>(wf.size(), 1.0f));  // beta 1 adds onto ones
      gemm.run_fp8(T, out, in, {x8.get(), in, false, &sx->scale_inv}, {w8.get(), in, false, &sw->scale_inv}, y.get(),
                   false, out, 0.0f, true, nullptr);
      gemm.run_fp8(T, in, out, {dy8.get(), out, hybrid, &sdy->scale_inv}, {wt8.get(), out, false, &sw->scale_inv},
                   dx.get(), false, in, 0.0f, false, nullptr);
      gemm.run_fp8(out, in, Tp, {dyt8.get(), Tp, hybrid, &sdy->scale_inv}, {xt8.get(), Tp, false, &sxt->scale_inv},
                   dw.get(), true, in, 1.0f, false, nullptr);
      const auto got_y = gpu_test::to_float(y.download()), got_dx = gpu_test::to_float(dx.download());
      auto got_dw = dw.download();
      for (auto& v : got_dw) v -= 1.0f;
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);

      // The transposed casts are the row-major casts transposed, byte for byte.
      const auto w8h = w8.download(), wt8h = wt8.download();
      for (int i = 0; i < out; ++i)
        for (int j = 0; j < in; ++j) ASSERT_EQ(w8h[std::size_t(i) * in + j], wt8h[std::size_t(j) * out + i]);
      expect_layouts(x8.download(), xt8.download(), T, in, "x");
      expect_layouts(dy8.download(), dyt8.download(), T, out, "dy");

      const auto xq = dequantize(x8, xf.size(), false, sx), wq = dequantize(w8, wf.size(), false, sw),
                 dyq = dequantize(dy8, dyf.size(), hybrid, sdy);
      const auto wfT = transpose(wf, out, in), wqT = transpose(wq, out, in);
      const auto dyfT = transpose(dyf, T, out), dyqT = transpose(dyq, T, out), xfT = transpose(xf, T, in),
                 xqT = transpose(xq, T, in);
      // The GEMM's own error, on the dequantized operands.
      EXPECT_LT(gpu_test::rel_error(got_y, nt_product(xq, wq, T, out, in)), 4e-3);
      EXPECT_LT(gpu_test::rel_error(got_dx, nt_product(dyq, wqT, T, in, out)), 4e-3);
      EXPECT_LT(gpu_test::rel_error(got_dw, nt_product(dyqT, xqT, out, in, T)), 1e-3);
      // The FP8 error budget, on the bf16 operands.
      const double ey = gpu_test::rel_error(got_y, nt_product(xf, wf, T, out, in)),
                   edx = gpu_test::rel_error(got_dx, nt_product(dyf, wfT, T, in, out)),
                   edw = gpu_test::rel_error(got_dw, nt_product(dyfT, xfT, out, in, T));
      const double grad_bound = hybrid ? 0.09 : 0.06;
      EXPECT_LT(ey, 0.06);
      EXPECT_LT(edx, grad_bound);
      EXPECT_LT(edw, grad_bound);
      EXPECT_GT(std::min({ey, edx, edw}), 0.01) << "the operands were not rounded to FP8";
      std::printf("[fp8 gemm] %dx%dx%d %s: relative error y %.4f dx %.4f dW %.4f\n", T, in, out,
                  hybrid ? "hybrid" : "e4m3", ey, edx, edw);
    }
}

// The samplers' FP8 GEMMs: a few rows over a large weight (a skinny shape: tuned over the heuristic's candidates and
// their split-K variants, gemm.h) and a row count that is not a multiple of 16 (the rows are no leading dimension),
// tuned and untuned, against the product of the dequantized operands.
TEST(Fp8Gemm, SkinnyShapesAndAnyRowCountMatchTheReference) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const int n = 4096, k = 2048;
  for (const int m : {32, 23, 1}) {
    SCOPED_TRACE(::testing::Message() << m << " rows");
    ASSERT_TRUE(Gemm::fp8_gemm_fits(m, n, k, k, k, n));
    ASSERT_LT(2.0 * m * n * k, Gemm::kTuneFlops);
    ASSERT_GE(double(m) * k + double(n) * k, Gemm::kTuneElements);
    std::mt19937 rng(5);
    std::vector<float> xf, wf;
    const DeviceVec<bf16> x(gpu_test::random_bf16(std::size_t(m) * k, rng, 2.0f, xf));
    const DeviceVec<bf16> w(gpu_test::random_bf16(std::size_t(n) * k, rng, 0.02f, wf));
    auto s = slots({kFp8E4m3Max, kFp8E4m3Max});
    DeviceVec<fp8> x8(xf.size()), w8(wf.size());
    cast_current(x.get(), m, k, s.get(), false, x8.get(), nullptr);
    cast_current(w.get(), n, k, s.get() + 1, false, w8.get(), nullptr);
    const auto want = nt_product(dequantize(x8, xf.size(), false, s.get()), dequantize(w8, wf.size(), false, s.get() + 1),
                                 m, n, k);
    for (const bool tune : {true, false}) {
      Gemm gemm(tune);
      DeviceVec<bf16> y(std::size_t(m) * n);
      for (int call = 0; call < 2; ++call) {  // tuned at the first, the kept algorithm at the second
        gemm.run_fp8(m, n, k, {x8.get(), k, false, &s.get()->scale_inv}, {w8.get(), k, false, &(s.get() + 1)->scale_inv},
                     y.get(), false, n, 0.0f, true, nullptr);
        // bf16 output (2^-9) and fast accumulation over k = 2048 (TE's forward choice); a wrong algorithm gives O(1).
        EXPECT_LT(gpu_test::rel_error(gpu_test::to_float(y.download()), want), 1e-2) << "tune " << tune << " call " << call;
      }
    }
  }
}

// Delayed scaling on the device follows the host's AmaxHistory: casts record their tensors' amax, each update rolls
// the window and derives the scale by the algorithm; a cast uses the scale as it stands and records its inverse.
TEST(Fp8Cast, DelayedScalingFollowsTheHostHistory) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  constexpr int kLen = 3, kRows = 16, kCols = 64;
  const std::vector<float> peaks = {2.0f, 40.0f, 0.5f, 0.0f, 3.0f, 1.0f, 0.25f};  // 0: an interval with no cast
  for (const auto algo : {Fp8Options::AmaxAlgo::kMax, Fp8Options::AmaxAlgo::kMostRecent}) {
    const bool algo_max = algo == Fp8Options::AmaxAlgo::kMax;
    SCOPED_TRACE(algo_max ? "max" : "most_recent");
    auto s = slots({kFp8E4m3Max, kFp8E5m2Max});
    DeviceVec<float> history(std::vector<float>(2 * kLen, 0.0f));
    AmaxHistory host[2] = {AmaxHistory(kLen, algo), AmaxHistory(kLen, algo)};
    float scale[2] = {1.0f, 1.0f};
    const float fmax[2] = {kFp8E4m3Max, kFp8E5m2Max};
    std::mt19937 rng(5);
    for (std::size_t t = 0; t < peaks.size(); ++t) {
      for (int k = 0; k < 2; ++k) {
        if (peaks[t] == 0.0f) continue;
        // Values below the peak, one element at -peak (the amax is of |x|).
        std::vector<float> xf;
        auto x16 = gpu_test::random_bf16(kRows * kCols, rng, peaks[t] / 8, xf);
        for (std::size_t i = 0; i < x16.size(); ++i)
          if (std::abs(xf[i]) >= peaks[t]) x16[i] = __float2bfloat16(0.0f), xf[i] = 0.0f;
        x16[7] = __float2bfloat16(-peaks[t]), xf[7] = -peaks[t];
        const DeviceVec<bf16> x(x16);
        DeviceVec<fp8> q(x16.size());
        fp8_quantize(x.get(), kRows, kCols, {s.get() + k, k == 1, false, 1.0f}, q.get(), nullptr, nullptr);
        host[k].record(peaks[t]);
        const auto deq = dequantize(q, x16.size(), k == 1, s.get() + k);
        // Within range the cast rounds (e4m3 2^-4, e5m2 2^-3 relative, plus the subnormals' absolute step); past
        // the format's max it saturates at max / scale.
        const double rel = k == 1 ? 0.125 : 0.0625, tiny = (k == 1 ? std::ldexp(1.0, -16) : std::ldexp(1.0, -9)) / scale[k];
        for (std::size_t i = 0; i < xf.size(); ++i) {
          const double want = std::clamp<double>(xf[i], -fmax[k] / scale[k], fmax[k] / scale[k]);
          ASSERT_LE(std::abs(deq[i] - want), rel * std::abs(want) + tiny) << "t " << t << " element " << i;
        }
      }
      fp8_update_delayed(s.get(), history.get(), 2, kLen, algo_max, 1.0f, nullptr);
      const auto got = s.download();
      const auto hist = history.download();
      for (int k = 0; k < 2; ++k) {
        scale[k] = host[k].update(fmax[k], 1.0f, scale[k]);
        EXPECT_FLOAT_EQ(got[k].scale, scale[k]) << "interval " << t << " slot " << k;
        EXPECT_EQ(got[k].amax, 0.0f);
        EXPECT_EQ(std::vector<float>(hist.begin() + k * kLen, hist.begin() + (k + 1) * kLen), host[k].window());
      }
    }
    // max keeps 40 for three intervals; most_recent drops it at once: the scales differ at the end only where the
    // window still holds a larger amax than the last.
    const auto got = s.download();
    EXPECT_FLOAT_EQ(got[0].scale, kFp8E4m3Max / (algo_max ? 3.0f : 0.25f));
  }
}

// Outliers saturate at +-max: 1e6, bf16's largest values, infinities; no Inf and no NaN code comes out, under the
// delayed cast (scale 1) and the tensorwise one (the amax of a tensor holding an infinity keeps the previous scale;
// without the infinity the scale follows bf16's largest value). NaN stays NaN.
TEST(Fp8Cast, SaturatesOutliersWithoutInfOrNan) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const float big = std::numeric_limits<float>::infinity(), lowest = std::ldexp(-(2.0f - std::ldexp(1.0f, -7)), 127);  // bf16's lowest finite
  const std::vector<float> values = {1e6f, -1e6f, lowest, -lowest, big, -big, 1.0f, -1e-3f, 448.0f, 60000.0f, 0.0f, 3.0f,
                                     -2.5f, 1e-30f, 7.0f, -8.0f};
  for (const bool e5m2 : {false, true})
    for (const bool with_inf : {true, false})
      for (const bool current : {false, true}) {
        SCOPED_TRACE(testing::Message() << (e5m2 ? "e5m2" : "e4m3") << (with_inf ? " with inf" : "")
                                        << (current ? " tensorwise" : " delayed"));
        std::vector<bf16> x16;
        for (float v : values) x16.push_back(__float2bfloat16(!with_inf && std::isinf(v) ? 1.0f : v));
        const int cols = static_cast<int>(x16.size());
        const float fmax = e5m2 ? kFp8E5m2Max : kFp8E4m3Max;
        auto s = slots({fmax});
        const DeviceVec<bf16> x(x16);
        DeviceVec<fp8> q(x16.size()), qt(x16.size());
        if (current) cast_current(x.get(), 1, cols, s.get(), e5m2, q.get(), nullptr);
        else fp8_quantize(x.get(), 1, cols, {s.get(), e5m2, false, 1.0f}, q.get(), nullptr, nullptr);
        const auto bytes = q.download();
        for (auto b : bytes) {
          const int mag = b & 0x7F;
          if (e5m2) EXPECT_LT(mag, 0x7C) << "Inf or NaN code " << int{b};
          else EXPECT_NE(mag, 0x7F) << "NaN code " << int{b};
        }
        const auto deq = dequantize(q, x16.size(), e5m2, s.get());
        const float scale = s.download()[0].scale;
        // With an infinity the amax keeps the previous scale (1); without, bf16's largest value maps to the max.
        EXPECT_FLOAT_EQ(scale, current && !with_inf ? fmax / -lowest : 1.0f);
        for (std::size_t i = 0; i < values.size(); ++i) {
          ASSERT_TRUE(std::isfinite(deq[i])) << values[i];
          const float v = __bfloat162float(x16[i]);
          if (std::abs(v) * scale >= fmax) EXPECT_FLOAT_EQ(deq[i] * scale, std::copysign(fmax, v)) << v;
        }
      }
  // NaN is not an outlier: it stays NaN (a diverged value is not hidden by the cast).
  const DeviceVec<bf16> x(std::vector<bf16>(16, __float2bfloat16(std::numeric_limits<float>::quiet_NaN())));
  auto s = slots({kFp8E4m3Max});
  DeviceVec<fp8> q(16);
  fp8_quantize(x.get(), 1, 16, {s.get(), false, false, 1.0f}, q.get(), nullptr, nullptr);
  EXPECT_TRUE(std::isnan(dequantize(q, 16, false, s.get())[0]));
}

// The casts fused into RMSNorm and SwiGLU write what fp8_quantize writes from their bf16 outputs, byte for byte,
// and the amax of those outputs; with no FP8 output (tensorwise) they record the amax alone.
TEST(Fp8Cast, FusedProducersMatchTheSeparateCast) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(9);
  auto check = [&](const DeviceVec<bf16>& y, std::size_t n, int rows, int cols, const DeviceVec<fp8>& fused,
                   Fp8Slot* fused_slot, Fp8Slot* amax_only_slot) {
    auto s = slots({kFp8E4m3Max});
    ASSERT_EQ(cudaMemcpy(&s.get()->scale, &fused_slot->scale, sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
    DeviceVec<fp8> separate(n);
    fp8_quantize(y.get(), rows, cols, {s.get(), false, false, 1.0f}, separate.get(), nullptr, nullptr);
    EXPECT_EQ(fused.download(), separate.download());
    const auto yh = gpu_test::to_float(y.download());
    float amax = 0;
    for (float v : yh) amax = std::max(amax, std::abs(v));
    const auto fs = read_slot(fused_slot), as = read_slot(amax_only_slot);
    EXPECT_EQ(fs.amax, amax);
    EXPECT_EQ(as.amax, amax);
    EXPECT_FLOAT_EQ(fs.scale_inv, 1.0f / fs.scale);
  };
  for (const int dim : {1024, 200}) {  // the one-vector-a-thread form and the looping one
    SCOPED_TRACE(dim);
    const int rows = 33;
    std::vector<float> xf;
    const DeviceVec<bf16> x(gpu_test::random_bf16(std::size_t(rows) * dim, rng, 2.0f, xf));
    std::vector<float> w(dim);
    for (auto& v : w) v = std::normal_distribution<float>(1.0f, 0.5f)(rng);
    const DeviceVec<float> dw(w);
    DeviceVec<bf16> y(std::size_t(rows) * dim), y2(std::size_t(rows) * dim);
    DeviceVec<float> rstd(rows);
    DeviceVec<fp8> q(std::size_t(rows) * dim);
    auto s = slots({kFp8E4m3Max, kFp8E4m3Max}, 37.0f);
    const Fp8Out cast{q.get(), s.get(), false}, amax_only{nullptr, s.get() + 1, false};
    rmsnorm_forward(x.get(), nullptr, nullptr, dw.get(), y.get(), rstd.get(), rows, dim, 1e-6f, nullptr, &cast);
    rmsnorm_forward(x.get(), nullptr, nullptr, dw.get(), y2.get(), rstd.get(), rows, dim, 1e-6f, nullptr, &amax_only);
    check(y, std::size_t(rows) * dim, rows, dim, q, s.get(), s.get() + 1);
  }
  for (const int ffn : {344, 1024}) {
    SCOPED_TRACE(ffn);
    const int rows = 7;  // rows * ffn / 8 threads: not whole warps at 344
    std::vector<float> guf;
    const DeviceVec<bf16> gu(gpu_test::random_bf16(std::size_t(rows) * 2 * ffn, rng, 3.0f, guf));
    DeviceVec<bf16> h(std::size_t(rows) * ffn), h2(std::size_t(rows) * ffn);
    DeviceVec<fp8> q(std::size_t(rows) * ffn);
    auto s = slots({kFp8E4m3Max, kFp8E4m3Max}, 21.0f);
    const Fp8Out cast{q.get(), s.get(), false}, amax_only{nullptr, s.get() + 1, false};
    swiglu_forward(gu.get(), h.get(), rows, ffn, nullptr, &cast);
    swiglu_forward(gu.get(), h2.get(), rows, ffn, nullptr, &amax_only);
    check(h, std::size_t(rows) * ffn, rows, ffn, q, s.get(), s.get() + 1);
  }
}

// The gradients' producers (RMSNorm backward for the residual gradient, SwiGLU backward for fc1's) max the amax of
// the bf16 values they write into a slot: the same amax as fp8_amax of their output, so the tensorwise cast that
// follows (without an amax pass) writes what the separate amax and cast write, byte for byte, in both layouts.
TEST(Fp8Cast, GradientProducersAmaxMatchesTheSeparatePass) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  // out [rows, cols] written by a producer that max-ed its amax into `fused` (zeroed before).
  auto check = [&](const DeviceVec<bf16>& out, int rows, int cols, Fp8Slot* fused) {
    const std::size_t n = std::size_t(rows) * cols;
    auto s = slots({kFp8E5m2Max});
    DeviceVec<fp8> separate(n), separate_t(n), cast(n), cast_t(n);
    cast_current(out.get(), rows, cols, s.get(), true, separate.get(), separate_t.get());
    fp8_quantize(out.get(), rows, cols, {fused, true, true, 1.0f}, cast.get(), cast_t.get(), nullptr);
    float amax = 0;
    for (float v : gpu_test::to_float(out.download())) amax = std::max(amax, std::abs(v));
    const auto fs = read_slot(fused), ss = read_slot(s.get());
    EXPECT_EQ(fs.amax, amax);
    EXPECT_EQ(fs.amax, ss.amax);
    EXPECT_EQ(fs.scale, ss.scale);
    EXPECT_EQ(differing(cast.download(), separate.download()), 0u) << "row-major";
    EXPECT_EQ(differing(cast_t.download(), separate_t.download()), 0u) << "transposed";
  };
  // The four forms of rmsnorm_backward: rows at a time (1024), one vector a thread (2048), a warp a row (208), a
  // block a row (2064); rows a multiple of 16 for the transposed cast.
  for (const int dim : {1024, 2048, 208, 2064}) {
    SCOPED_TRACE(dim);
    const int rows = 48;
    const std::size_t n = std::size_t(rows) * dim;
    std::vector<float> f;
    const DeviceVec<bf16> dy(gpu_test::random_bf16(n, rng, 3.0f, f)), s(gpu_test::random_bf16(n, rng, 1.0f, f));
    DeviceVec<bf16> dres(gpu_test::random_bf16(n, rng, 0.5f, f));
    std::vector<float> w(dim), r(rows);
    for (auto& v : w) v = std::normal_distribution<float>(1.0f, 0.5f)(rng);
    for (auto& v : r) v = std::uniform_real_distribution<float>(0.5f, 2.0f)(rng);
    const DeviceVec<float> norm_w(w), rstd(r);
    DeviceVec<float> dw(std::vector<float>(dim, 0.0f)), partial(static_cast<std::size_t>(rmsnorm_partial_floats(rows, dim)));
    auto fused = slots({kFp8E5m2Max});
    rmsnorm_backward(dy.get(), s.get(), norm_w.get(), rstd.get(), dres.get(), true, dw.get(), partial.get(), rows, dim,
                     nullptr, fused.get());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    check(dres, rows, dim, fused.get());
  }
  for (const int ffn : {344, 1024}) {
    SCOPED_TRACE(ffn);
    const int rows = 16;  // rows * ffn / 8 threads: not whole warps at 344
    std::vector<float> f;
    const DeviceVec<bf16> gu(gpu_test::random_bf16(std::size_t(rows) * 2 * ffn, rng, 3.0f, f)),
        dh(gpu_test::random_bf16(std::size_t(rows) * ffn, rng, 2.0f, f));
    DeviceVec<bf16> dgu(std::size_t(rows) * 2 * ffn);
    auto fused = slots({kFp8E5m2Max});
    swiglu_backward(dh.get(), gu.get(), dgu.get(), rows, ffn, nullptr, fused.get());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    check(dgu, rows, 2 * ffn, fused.get());
  }
}

// SwiGLU's forward and backward straight into FP8 (delayed: the scale as it stands) write what swiglu_forward /
// swiglu_backward then the separate cast write, byte for byte in both layouts, and record the same amax; at 30 rows
// the transposed layouts padded to 32 with zeros.
TEST(Fp8Cast, SwigluInFp8MatchesTheSeparateCast) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(13);
  for (const int rows : {48, 30})
    for (const int ffn : {352, 1024})
      for (const bool e5m2 : {true, false}) {
        SCOPED_TRACE(testing::Message() << rows << " rows, " << ffn << (e5m2 ? " e5m2" : " e4m3"));
        const std::size_t n = std::size_t(rows) * 2 * ffn, np = std::size_t(fp8_padded_rows(rows)) * 2 * ffn;
        std::vector<float> f;
        const DeviceVec<bf16> gu(gpu_test::random_bf16(n, rng, 3.0f, f)),
            dh(gpu_test::random_bf16(std::size_t(rows) * ffn, rng, 2.0f, f));
        const float fmax = e5m2 ? kFp8E5m2Max : kFp8E4m3Max;
        auto s = slots({fmax, fmax}, 0.0f);
        const float scale = e5m2 ? 3000.0f : 25.0f;  // some values saturate
        const Fp8Slot init{.scale_inv = 1.0f, .amax = 0.0f, .scale = scale, .fp8_max = fmax};
        ASSERT_EQ(cudaMemcpy(s.get(), &init, sizeof init, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(s.get() + 1, &init, sizeof init, cudaMemcpyHostToDevice), cudaSuccess);
        DeviceVec<bf16> dgu(n);
        DeviceVec<fp8> separate = sentinel_fp8(np), separate_t = sentinel_fp8(np), fused = sentinel_fp8(np),
                       fused_t = sentinel_fp8(np);
        swiglu_backward(dh.get(), gu.get(), dgu.get(), rows, ffn, nullptr);
        fp8_quantize(dgu.get(), rows, 2 * ffn, {s.get(), e5m2, false, 1.0f}, separate.get(), separate_t.get(), nullptr);
        swiglu_backward_fp8(dh.get(), gu.get(), rows, ffn, {s.get() + 1, e5m2, false, 1.0f}, fused.get(), fused_t.get(),
                            nullptr);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        expect_same_casts(fused, fused_t, separate, separate_t, rows, 2 * ffn, "backward");
        float amax = 0;
        for (float v : gpu_test::to_float(dgu.download())) amax = std::max(amax, std::abs(v));
        const auto fs = read_slot(s.get() + 1), ss = read_slot(s.get());
        EXPECT_EQ(fs.amax, amax) << "backward";
        EXPECT_EQ(ss.amax, amax) << "backward";
        EXPECT_FLOAT_EQ(fs.scale_inv, 1.0f / scale) << "backward";
        // The forward: h [rows, ffn].
        const std::size_t hn = std::size_t(rows) * ffn, hnp = np / 2;
        ASSERT_EQ(cudaMemcpy(s.get(), &init, sizeof init, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(s.get() + 1, &init, sizeof init, cudaMemcpyHostToDevice), cudaSuccess);
        DeviceVec<bf16> h(hn);
        DeviceVec<fp8> hs = sentinel_fp8(hnp), hs_t = sentinel_fp8(hnp), hf = sentinel_fp8(hnp),
                       hf_t = sentinel_fp8(hnp);
        swiglu_forward(gu.get(), h.get(), rows, ffn, nullptr);
        fp8_quantize(h.get(), rows, ffn, {s.get(), e5m2, false, 1.0f}, hs.get(), hs_t.get(), nullptr);
        swiglu_forward_fp8(gu.get(), rows, ffn, {s.get() + 1, e5m2, false, 1.0f}, hf.get(), hf_t.get(), nullptr);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        expect_same_casts(hf, hf_t, hs, hs_t, rows, ffn, "forward");
        float hmax = 0;
        for (float v : gpu_test::to_float(h.download())) hmax = std::max(hmax, std::abs(v));
        EXPECT_EQ(read_slot(s.get() + 1).amax, hmax) << "forward";
        EXPECT_EQ(read_slot(s.get()).amax, hmax) << "forward";
      }
}

// Tensorwise: SwiGLU's amax pass (swiglu_forward_amax, _backward_amax) then SwiGLU straight into FP8 with its scale
// write what SwiGLU into bf16, the tensor's amax and the tensorwise cast write, in both layouts, with the same scale;
// at any row count (80: two row tiles, the second partial; 46 and 2047: padded transposes).
TEST(Fp8Cast, SwigluAmaxPassThenFp8MatchesTheTensorwiseCast) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(17);
  for (const int rows : {80, 46, 2047})
    for (const int ffn : {352, 1024}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows, ffn " << ffn);
      const std::size_t n = std::size_t(rows) * 2 * ffn, hn = std::size_t(rows) * ffn;
      const std::size_t np = std::size_t(fp8_padded_rows(rows)) * 2 * ffn, hnp = np / 2;
      std::vector<float> f;
      const DeviceVec<bf16> gu(gpu_test::random_bf16(n, rng, 3.0f, f)), dh(gpu_test::random_bf16(hn, rng, 2.0f, f));
      auto s = slots({kFp8E5m2Max, kFp8E5m2Max, kFp8E4m3Max, kFp8E4m3Max});
      DeviceVec<bf16> dgu(n), h(hn);
      DeviceVec<fp8> separate = sentinel_fp8(np), separate_t = sentinel_fp8(np), fused = sentinel_fp8(np),
                     fused_t = sentinel_fp8(np);
      swiglu_backward(dh.get(), gu.get(), dgu.get(), rows, ffn, nullptr);
      cast_current(dgu.get(), rows, 2 * ffn, s.get(), true, separate.get(), separate_t.get());
      swiglu_backward_amax(dh.get(), gu.get(), rows, ffn, s.get() + 1, nullptr);
      swiglu_backward_fp8(dh.get(), gu.get(), rows, ffn, {s.get() + 1, true, true, 1.0f}, fused.get(), fused_t.get(),
                          nullptr);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      expect_same_casts(fused, fused_t, separate, separate_t, rows, 2 * ffn, "backward");
      auto same_slot = [](const Fp8Slot& a, const Fp8Slot& b, const char* what) {
        EXPECT_EQ(a.amax, b.amax) << what;
        EXPECT_EQ(a.scale, b.scale) << what;
        EXPECT_EQ(a.scale_inv, b.scale_inv) << what;
        EXPECT_NE(a.scale, 1.0f) << what;  // derived from the amax, not the initial scale
      };
      same_slot(read_slot(s.get() + 1), read_slot(s.get()), "backward");
      DeviceVec<fp8> hs = sentinel_fp8(hnp), hs_t = sentinel_fp8(hnp), hf = sentinel_fp8(hnp), hf_t = sentinel_fp8(hnp);
      swiglu_forward(gu.get(), h.get(), rows, ffn, nullptr);
      cast_current(h.get(), rows, ffn, s.get() + 2, false, hs.get(), hs_t.get());
      swiglu_forward_amax(gu.get(), rows, ffn, s.get() + 3, nullptr);
      swiglu_forward_fp8(gu.get(), rows, ffn, {s.get() + 3, false, true, 1.0f}, hf.get(), hf_t.get(), nullptr);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      expect_same_casts(hf, hf_t, hs, hs_t, rows, ffn, "forward");
      same_slot(read_slot(s.get() + 3), read_slot(s.get() + 2), "forward");
    }
}

}  // namespace
}  // namespace dlm::train::cuda
