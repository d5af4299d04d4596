// Rotary position embedding in HF Llama/Qwen3's rotate_half form: for head dim D and i < D/2,
//   f_i = theta^(-2i/D), a = pos * f_i,
//   y_i = x_i cos a - x_{i+D/2} sin a,   y_{i+D/2} = x_{i+D/2} cos a + x_i sin a.
// The map is a rotation, so the backward is the rotation by -a. f_i and a are formed in fp32 as HF
// does (inv_freq = 1 / base^(2i/D), freqs = inv_freq * pos), so long positions round the same way.
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "cpu_backend.h"
#include "dlm/common/error.h"

namespace dlm::train::cpu {

namespace {

void rotate(CpuBackend& be, const Tensor& x, const Tensor& positions, double theta, const Tensor& y, float sign) {
  const std::int64_t n = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  if (d % 2 != 0) fail(fmt::format("cpu backend: rope: head dim {} is odd", d));
  expect_numel("rope", "positions", positions, n);
  expect_numel("rope", "y", y, x.numel());
  std::vector<float> inv_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(d));
  const std::int32_t* pos = i32(positions);
  const float* px = f32(x);
  float* py = f32(y);
  be.parallel_for(n, 8, [&](std::int64_t b, std::int64_t e) {
    std::vector<float> c(static_cast<std::size_t>(half)), s(static_cast<std::size_t>(half));
    for (std::int64_t t = b; t < e; ++t) {
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = inv_freq[i] * static_cast<float>(pos[t]);
        c[i] = static_cast<float>(std::cos(double(a)));
        s[i] = sign * static_cast<float>(std::sin(double(a)));
      }
      for (std::int64_t h = 0; h < heads; ++h) {
        const float* xr = px + (t * heads + h) * d;
        float* yr = py + (t * heads + h) * d;
        for (std::int64_t i = 0; i < half; ++i) {
          const float lo = xr[i], hi = xr[i + half];  // read both before writing: y may alias x
          yr[i] = lo * c[i] - hi * s[i];
          yr[i + half] = hi * c[i] + lo * s[i];
        }
      }
    }
  });
}

}  // namespace

void CpuBackend::rope_forward(const Tensor& x, const Tensor& positions, double theta, const Tensor& y) {
  rotate(*this, x, positions, theta, y, 1.0f);
}

void CpuBackend::rope_backward(const Tensor& dy, const Tensor& positions, double theta, const Tensor& dx) {
  rotate(*this, dy, positions, theta, dx, -1.0f);
}

}  // namespace dlm::train::cpu
