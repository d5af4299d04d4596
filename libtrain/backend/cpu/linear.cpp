// Bias-free linear projection in torch's layout (W [out, in]) through BLAS:
//   y = x W^T;   dx = dy W;   dW += dy^T x  (beta = 1: parameter gradients accumulate).
// OpenBLAS threads these GEMMs itself, so they run on the calling thread, not on the pool.
#include <cblas.h>

#include "cpu_backend.h"

namespace dlm::train::cpu {

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& y) {
  const std::int64_t m = w.dim(0), k = w.dim(1), n = x.numel() / k;
  expect_numel("linear_forward", "x", x, n * k);
  expect_numel("linear_forward", "y", y, n * m);
  if (n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(m), int(k), 1.0f, f32(x), int(k), f32(w), int(k),
              0.0f, f32(y), int(m));
}

void CpuBackend::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                                 const Tensor& dw) {
  const std::int64_t m = w.dim(0), k = w.dim(1), n = x.numel() / k;
  expect_numel("linear_backward", "x", x, n * k);
  expect_numel("linear_backward", "dy", dy, n * m);
  expect_numel("linear_backward", "dw", dw, m * k);
  if (n == 0) return;
  if (dx.defined()) {
    expect_numel("linear_backward", "dx", dx, n * k);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(k), int(m), 1.0f, f32(dy), int(m), f32(w),
                int(k), 0.0f, f32(dx), int(k));
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(m), int(k), int(n), 1.0f, f32(dy), int(m), f32(x), int(k),
              1.0f, f32(dw), int(k));
}

}  // namespace dlm::train::cpu
