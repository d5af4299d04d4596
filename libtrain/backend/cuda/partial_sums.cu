// The second, fixed-order half of the norms' weight gradients: dst[j] += sum over r of partial[r][j].
// A block owns 32 columns; its 16 warps sum rows w, w + 16, w + 32, ... in order (the loads of a warp are
// one 128-byte line, many in flight), then warp 0 adds the 16 sums in warp order. The order depends only on
// the row count, so the result is the same on every run. Sixteen warps a column block keep enough loads in
// flight; one thread per column over all rows would leave the memory mostly idle at a thousand rows.
#include "common.cuh"
#include "kernels.h"

namespace dlm::train::cuda {
namespace {

constexpr int kColumns = 32, kRowLanes = 16;

__global__ void __launch_bounds__(kColumns* kRowLanes)
    sum_rows(const float* partial, int rows, int cols, float* lo, float* hi, int split) {
  __shared__ float part[kRowLanes][kColumns + 1];
  const int lane = threadIdx.x % kColumns, row_lane = threadIdx.x / kColumns;
  const int col = blockIdx.x * kColumns + lane;
  float acc = 0.0f;
  if (col < cols) {
#pragma unroll 8
    for (int r = row_lane; r < rows; r += kRowLanes) acc += partial[static_cast<std::int64_t>(r) * cols + col];
  }
  part[row_lane][lane] = acc;
  __syncthreads();
  if (row_lane != 0 || col >= cols) return;
  float total = 0.0f;
  for (int w = 0; w < kRowLanes; ++w) total += part[w][lane];
  if (col < split) lo[col] += total;
  else hi[col - split] += total;
}

}  // namespace

void sum_partial_rows(const float* partial, int rows, int cols, float* lo, float* hi, int split, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  sum_rows<<<(cols + kColumns - 1) / kColumns, kColumns * kRowLanes, 0, stream>>>(partial, rows, cols, lo, hi, split);
}

}  // namespace dlm::train::cuda
