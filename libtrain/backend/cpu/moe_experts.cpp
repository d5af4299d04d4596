// Dropless mixture-of-experts SwiGLU experts (the math is in backend.h):
//   forward:  rows (n, j) sorted by expert (stable: token order within an expert), one GEMM pair per expert
//             over its contiguous rows: gate_up_e = x_e fc1[e]^T, act_e = swiglu(gate_up_e), y_e = act_e fc2[e]^T;
//             out[n] = sum_j w[n, j] y[n, j].
//   backward: dy[n, j] = w[n, j] dout[n], dw[n, j] = dout[n] . y[n, j] (y recomputed from act),
//             dact_e = dy_e fc2[e], dfc2[e] += dy_e^T act_e, dgate_up = swiglu'(dact),
//             dx_e = dgate_up_e fc1[e], dfc1[e] += dgate_up_e^T x_e, dx[n] = sum_j dx[n, j].
// gate_up and act hold their rows in that sorted order. The GEMMs run on the calling thread (OpenBLAS
// threads them); gathers and the combine are row-parallel on the pool.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "cpu_backend.h"
#include "dlm/common/error.h"

namespace dlm::train::cpu {
namespace {

// The (token, slot) rows grouped by expert: order[r] = n * k + j for the r-th row, experts' rows contiguous
// from offset[e]; where[n * k + j] = r.
struct ExpertRows {
  std::vector<std::int64_t> order, where, offset;
};

ExpertRows sort_by_expert(const std::int32_t* idx, std::int64_t rows, std::int64_t experts) {
  ExpertRows s;
  s.offset.assign(static_cast<std::size_t>(experts + 1), 0);
  for (std::int64_t i = 0; i < rows; ++i) {
    if (idx[i] < 0 || idx[i] >= experts)
      fail(fmt::format("moe_experts: expert index {} at row {} is outside [0, {})", idx[i], i, experts));
    ++s.offset[idx[i] + 1];
  }
  for (std::int64_t e = 0; e < experts; ++e) s.offset[e + 1] += s.offset[e];
  std::vector<std::int64_t> next(s.offset.begin(), s.offset.end() - 1);
  s.order.resize(static_cast<std::size_t>(rows));
  s.where.resize(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t r = next[idx[i]]++;
    s.order[r] = i;
    s.where[i] = r;
  }
  return s;
}

// C [m, n] (= or +=) A [m, kk] op(B): B is [n, kk] when transposed, [kk, n] otherwise.
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t kk, const float* a, const float* b,
          float beta, float* c) {
  if (m == 0 || n == 0 || (kk == 0 && beta == 1.0f)) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m), int(n),
              int(kk), 1.0f, a, trans_a ? int(m) : int(kk), b, trans_b ? int(kk) : int(n), beta, c, int(n));
}

}  // namespace

void CpuBackend::moe_experts_forward(const Tensor& x, const Tensor& idx, const Tensor& w, const Tensor& fc1,
                                     const Tensor& fc2, const Tensor& out, const Tensor& gate_up, const Tensor& act) {
  const std::int64_t experts = fc1.dim(0), f = fc2.dim(2), h = fc2.dim(1), n = x.numel() / h, k = idx.numel() / n;
  expect_numel("moe_experts_forward", "w", w, n * k);
  expect_numel("moe_experts_forward", "fc1", fc1, experts * 2 * f * h);
  expect_numel("moe_experts_forward", "out", out, n * h);
  expect_numel("moe_experts_forward", "gate_up", gate_up, n * k * 2 * f);
  expect_numel("moe_experts_forward", "act", act, n * k * f);
  const ExpertRows s = sort_by_expert(i32(idx), n * k, experts);
  const float *xp = f32(x), *wp = f32(w), *w1 = f32(fc1), *w2 = f32(fc2);
  float *gu = f32(gate_up), *ap = f32(act), *op = f32(out);
  std::vector<float> xs(static_cast<std::size_t>(n * k * h)), ys(static_cast<std::size_t>(n * k * h));
  parallel_for(n * k, 64, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) std::copy_n(xp + s.order[r] / k * h, h, xs.data() + r * h);
  });
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = s.offset[e], m = s.offset[e + 1] - r0;
    gemm(false, true, m, 2 * f, h, xs.data() + r0 * h, w1 + e * 2 * f * h, 0.0f, gu + r0 * 2 * f);
  }
  swiglu_forward(gate_up, act);
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = s.offset[e], m = s.offset[e + 1] - r0;
    gemm(false, true, m, h, f, ap + r0 * f, w2 + e * h * f, 0.0f, ys.data() + r0 * h);
  }
  parallel_for(n, 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) {
      float* o = op + t * h;
      std::fill_n(o, h, 0.0f);
      for (std::int64_t j = 0; j < k; ++j) {
        const float c = wp[t * k + j];
        const float* y = ys.data() + s.where[t * k + j] * h;
        for (std::int64_t i = 0; i < h; ++i) o[i] += c * y[i];
      }
    }
  });
}

void CpuBackend::moe_experts_backward(const Tensor& dout, const Tensor& x, const Tensor& idx, const Tensor& w,
                                      const Tensor& fc1, const Tensor& fc2, const Tensor& gate_up, const Tensor& act,
                                      const Tensor& dx, const Tensor& dw, const Tensor& dfc1, const Tensor& dfc2) {
  const std::int64_t experts = fc1.dim(0), f = fc2.dim(2), h = fc2.dim(1), n = x.numel() / h, k = idx.numel() / n;
  expect_numel("moe_experts_backward", "dout", dout, n * h);
  expect_numel("moe_experts_backward", "dx", dx, n * h);
  expect_numel("moe_experts_backward", "dw", dw, n * k);
  expect_numel("moe_experts_backward", "dfc1", dfc1, fc1.numel());
  expect_numel("moe_experts_backward", "dfc2", dfc2, fc2.numel());
  expect_numel("moe_experts_backward", "gate_up", gate_up, n * k * 2 * f);
  const ExpertRows s = sort_by_expert(i32(idx), n * k, experts);
  const float *xp = f32(x), *wp = f32(w), *w1 = f32(fc1), *w2 = f32(fc2), *ap = f32(act), *dop = f32(dout);
  float *dxp = f32(dx), *dwp = f32(dw), *dw1 = f32(dfc1), *dw2 = f32(dfc2);
  std::vector<float> xs(static_cast<std::size_t>(n * k * h)), ys(static_cast<std::size_t>(n * k * h)),
      dys(static_cast<std::size_t>(n * k * h));
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = s.offset[e], m = s.offset[e + 1] - r0;
    gemm(false, true, m, h, f, ap + r0 * f, w2 + e * h * f, 0.0f, ys.data() + r0 * h);
  }
  parallel_for(n * k, 64, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      const std::int64_t t = s.order[r] / k;
      const float c = wp[s.order[r]];
      const float *d = dop + t * h, *y = ys.data() + r * h;
      float* dy = dys.data() + r * h;
      double dot = 0;
      for (std::int64_t i = 0; i < h; ++i) {
        dot += double(d[i]) * y[i];
        dy[i] = c * d[i];
      }
      dwp[s.order[r]] = static_cast<float>(dot);
      std::copy_n(xp + t * h, h, xs.data() + r * h);
    }
  });
  const Tensor dact = alloc({n * k, f}, DType::kF32), dgate_up = alloc({n * k, 2 * f}, DType::kF32);
  float *dap = f32(dact), *dgu = f32(dgate_up);
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = s.offset[e], m = s.offset[e + 1] - r0;
    gemm(false, false, m, f, h, dys.data() + r0 * h, w2 + e * h * f, 0.0f, dap + r0 * f);
    gemm(true, false, h, f, m, dys.data() + r0 * h, ap + r0 * f, 1.0f, dw2 + e * h * f);
  }
  swiglu_backward(dact, gate_up, dgate_up);
  std::vector<float>& dxs = ys;  // y is no longer needed
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = s.offset[e], m = s.offset[e + 1] - r0;
    gemm(false, false, m, h, 2 * f, dgu + r0 * 2 * f, w1 + e * 2 * f * h, 0.0f, dxs.data() + r0 * h);
    gemm(true, false, 2 * f, h, m, dgu + r0 * 2 * f, xs.data() + r0 * h, 1.0f, dw1 + e * 2 * f * h);
  }
  parallel_for(n, 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) {
      float* o = dxp + t * h;
      std::fill_n(o, h, 0.0f);
      for (std::int64_t j = 0; j < k; ++j) {
        const float* d = dxs.data() + s.where[t * k + j] * h;
        for (std::int64_t i = 0; i < h; ++i) o[i] += d[i];
      }
    }
  });
}

}  // namespace dlm::train::cpu
