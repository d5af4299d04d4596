// RMSNorm over the last dimension, as HF's LlamaRMSNorm / Qwen3RMSNorm (fp32):
//   rstd = 1 / sqrt(mean_j x_j^2 + eps),  y_j = w_j * x_j * rstd.
// Backward, with xhat = x * rstd and g = dy * w:
//   dx = rstd * (g - xhat * mean_j(g_j * xhat_j)),   dw += sum over rows of dy * xhat.
// Sums run in double; dw is reduced over rows per column block so threads never share an element.
#include <cmath>

#include "cpu_backend.h"

namespace dlm::train::cpu {

void CpuBackend::rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) {
  const std::int64_t d = w.numel(), rows = x.numel() / d;
  expect_numel("rmsnorm_forward", "x", x, rows * d);
  expect_numel("rmsnorm_forward", "y", y, rows * d);
  expect_numel("rmsnorm_forward", "rstd", rstd, rows);
  const float *px = f32(x), *pw = f32(w);
  float *py = f32(y), *pr = f32(rstd);
  parallel_for(rows, 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      const float* xr = px + r * d;
      double ss = 0;
      for (std::int64_t j = 0; j < d; ++j) ss += double(xr[j]) * xr[j];
      const float s = static_cast<float>(1.0 / std::sqrt(ss / double(d) + eps));
      pr[r] = s;
      float* yr = py + r * d;
      for (std::int64_t j = 0; j < d; ++j) yr[j] = pw[j] * (xr[j] * s);
    }
  });
}

void CpuBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                  const Tensor& dx, const Tensor& dw) {
  const std::int64_t d = w.numel(), rows = x.numel() / d;
  expect_numel("rmsnorm_backward", "dy", dy, rows * d);
  expect_numel("rmsnorm_backward", "dx", dx, rows * d);
  expect_numel("rmsnorm_backward", "dw", dw, d);
  expect_numel("rmsnorm_backward", "rstd", rstd, rows);
  const float *pdy = f32(dy), *px = f32(x), *pw = f32(w), *pr = f32(rstd);
  float *pdx = f32(dx), *pdw = f32(dw);
  parallel_for(rows, 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      const float *g = pdy + r * d, *xr = px + r * d;
      const double s = pr[r];
      double dot = 0;
      for (std::int64_t j = 0; j < d; ++j) dot += double(g[j]) * pw[j] * xr[j] * s;
      const double mean = dot / double(d);
      float* out = pdx + r * d;
      for (std::int64_t j = 0; j < d; ++j) out[j] = static_cast<float>(s * (double(g[j]) * pw[j] - xr[j] * s * mean));
    }
  });
  parallel_for(d, 8, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t j = b; j < e; ++j) {
      double acc = 0;
      for (std::int64_t r = 0; r < rows; ++r) acc += double(pdy[r * d + j]) * px[r * d + j] * pr[r];
      pdw[j] += static_cast<float>(acc);
    }
  });
}

}  // namespace dlm::train::cpu
