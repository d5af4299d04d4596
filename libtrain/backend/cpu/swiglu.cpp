// SwiGLU on Megatron's fused fc1 rows [gate | up]:
//   out = silu(g) * u,  silu(g) = g s(g),  s = sigmoid;
//   dg = dout * u * s(g) (1 + g (1 - s(g))),   du = dout * silu(g).
#include <cmath>

#include "cpu_backend.h"

namespace dlm::train::cpu {

void CpuBackend::swiglu_forward(const Tensor& gate_up, const Tensor& out) {
  const std::int64_t f = out.dim(out.rank() - 1), n = out.numel() / f;
  expect_numel("swiglu_forward", "gate_up", gate_up, 2 * n * f);
  const float* in = f32(gate_up);
  float* o = f32(out);
  parallel_for(n, 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) {
      const float *g = in + t * 2 * f, *u = g + f;
      for (std::int64_t j = 0; j < f; ++j) o[t * f + j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    }
  });
}

void CpuBackend::swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up) {
  const std::int64_t f = dout.dim(dout.rank() - 1), n = dout.numel() / f;
  expect_numel("swiglu_backward", "gate_up", gate_up, 2 * n * f);
  expect_numel("swiglu_backward", "dgate_up", dgate_up, 2 * n * f);
  const float *in = f32(gate_up), *d = f32(dout);
  float* o = f32(dgate_up);
  parallel_for(n, 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) {
      const float *g = in + t * 2 * f, *u = g + f, *dt = d + t * f;
      float *dg = o + t * 2 * f, *du = dg + f;
      for (std::int64_t j = 0; j < f; ++j) {
        const float s = 1.0f / (1.0f + std::exp(-g[j]));
        dg[j] = dt[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
        du[j] = dt[j] * g[j] * s;
      }
    }
  });
}

}  // namespace dlm::train::cpu
