// The training step's RMSNorm kernels alone (backend/cuda/rmsnorm.cu) at the benchmark models' shapes: the
// residual add + norm forward, the backward (with its fixed-order weight-gradient sum), and that sum
// (partial_sums.cu) by itself, per call in microseconds and TB/s of the bytes each must move (forward: x, add,
// s and y, 8 bytes an element; backward: dy, s, dres read and written, 8 bytes an element; the sum: the partial
// rows), so the distance to the memory's speed (~2.85 TB/s for a copy, adamw_bench) shows per kernel. The last
// case is a width the one-vector-a-thread forms do not take (not a multiple of 256): it times the fallbacks,
// the looping forward and the warp-per-row backward, against the forms the models' widths run.
// usage: norm_bench [REPS=50]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/kernels.h"
#include "kernel_bench.h"

namespace {

using dlm::bench::device_alloc;
using dlm::train::cuda::bf16;
using dlm::train::cuda::check_cuda;

template <typename F>
double time_us(F&& f, int reps) {
  return 1e3 * dlm::bench::time_ms(f, reps);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  if (reps < 1) {
    std::fprintf(stderr, "norm_bench: REPS must be a positive integer\n");
    return 2;
  }
  struct Case {
    const char* what;
    int rows, dim;
  };
  const Case cases[] = {{"350M", 16384, 1024}, {"1.7B", 8192, 2048}, {"other", 16384, 1000}};
  try {
    for (const auto& c : cases) {
      const std::size_t n = std::size_t(c.rows) * c.dim;
      bf16 *x = device_alloc<bf16>(n), *add = device_alloc<bf16>(n), *s = device_alloc<bf16>(n);
      bf16 *y = device_alloc<bf16>(n), *dres = device_alloc<bf16>(n);
      float *w = device_alloc<float>(c.dim), *dw = device_alloc<float>(c.dim), *rstd = device_alloc<float>(c.rows);
      const auto partial_floats = dlm::train::cuda::rmsnorm_partial_floats(c.rows, c.dim);
      float* partial = device_alloc<float>(partial_floats);
      dlm::bench::fill_random(x, n), dlm::bench::fill_random(add, n, 7), dlm::bench::fill_random(dres, n, 9);
      const std::vector<float> ones(c.dim, 1.0f);
      check_cuda(cudaMemcpy(w, ones.data(), c.dim * 4, cudaMemcpyHostToDevice), "w");
      check_cuda(cudaMemset(dw, 0, c.dim * 4), "dw"), check_cuda(cudaMemset(partial, 0, partial_floats * 4), "partial");
      namespace cuda = dlm::train::cuda;
      const double fwd =
          time_us([&] { cuda::rmsnorm_forward(x, add, s, w, y, rstd, c.rows, c.dim, 1e-6f, nullptr); }, reps);
      const double bwd = time_us(
          [&] { cuda::rmsnorm_backward(y, s, w, rstd, dres, true, dw, partial, c.rows, c.dim, nullptr); }, reps);
      const int partial_rows = static_cast<int>(partial_floats / c.dim);
      const double sum = time_us(
          [&] { dlm::train::cuda::sum_partial_rows(partial, partial_rows, c.dim, dw, dw, c.dim, nullptr); }, reps);
      check_cuda(cudaGetLastError(), "launch");
      const double bytes = 8.0 * n;
      std::printf("%-5s rows %d dim %d: forward %.1f us (%.2f TB/s), backward %.1f us (%.2f TB/s, its partial "
                  "sum of %d rows %.1f us, %.2f TB/s)\n",
                  c.what, c.rows, c.dim, fwd, bytes / (fwd * 1e6), bwd, bytes / (bwd * 1e6), partial_rows, sum,
                  4.0 * partial_floats / (sum * 1e6));
      for (void* p : {static_cast<void*>(x), static_cast<void*>(add), static_cast<void*>(s), static_cast<void*>(y),
                      static_cast<void*>(dres), static_cast<void*>(w), static_cast<void*>(dw),
                      static_cast<void*>(rstd), static_cast<void*>(partial)})
        cudaFree(p);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "norm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
