// Multi-tensor AdamW (torch.optim.AdamW's update, see optimizer.h) and the global gradient norm, each one
// launch over every parameter tensor cut into chunks of kAdamWChunk elements, one block a chunk, so that
// the large tensors (the 311M-element embedding and output layer of the 1.7B) spread over the whole GPU
// instead of a fixed number of blocks per tensor; 16-byte accesses.
//   clip = min(1, max_norm / (sqrt(sum g^2) + 1e-6))   (Megatron's rule; max_norm <= 0: 1), g <- clip * g
//   p <- p (1 - lr wd);  m <- m + (1 - b1)(g - m);  v <- b2 v + (1 - b2) g^2
//   p <- p - lr / (1 - b1^s) * m / (sqrt(v) / sqrt(1 - b2^s) + eps)
// with p read from and written back to its two halves (master_split.h), the upper one the bf16 weight.
// The norm's sum of squares is taken per chunk in double and summed over chunks in a fixed order, so it is
// the same number on every run; the clip factor is read on the device (no host round trip). A tensor that
// flags its written rows (the embedding's, CudaModel::set_sparse_embedding_grad) is read only there.
// The zero count (--log-num-zeros-in-grad, Megatron's count_zeros_fp32) walks the norm's chunks: g == 0 exactly,
// the unflagged rows of such a tensor counted as the zeros they hold; integer sums, so exact in any order.
#include <cmath>

#include "common.cuh"
#include "kernels.h"
#include "master_split.h"

namespace dlm::train::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ double block_sum_d(double v) {
  __shared__ double scratch[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.0;
  return warp_sum_d(v);
}

// The elements [begin, end) of the chunk's tensor; begin is a multiple of kAdamWChunk.
struct Range {
  std::int64_t begin, end, end4;
};
__device__ __forceinline__ Range chunk_range(const AdamWTensor& t, const AdamWChunk& c) {
  const std::int64_t begin = static_cast<std::int64_t>(c.piece) * kAdamWChunk;
  const std::int64_t end = begin + kAdamWChunk < t.numel ? begin + kAdamWChunk : t.numel;
  return {begin, end, begin + (end - begin) / 4 * 4};
}

// Whether element i of the chunk starting at `begin` may hold a non-zero gradient: always, unless the tensor
// flags its written rows (AdamWTensor::rows_written). The row is counted in 32 bits from the chunk's first
// (a chunk is < 2^31 elements), and is the same for a float4 (row_len % 4 == 0).
struct RowFlags {
  const std::uint8_t* flags;
  std::int64_t first_row;
  unsigned offset, row_len;
};
__device__ __forceinline__ RowFlags row_flags(const AdamWTensor& t, std::int64_t begin) {
  if (!t.rows_written) return {nullptr, 0, 0, 1};
  return {t.rows_written, begin / t.row_len, static_cast<unsigned>(begin % t.row_len),
          static_cast<unsigned>(t.row_len)};
}
__device__ __forceinline__ bool may_be_written(const RowFlags& f, std::int64_t begin, std::int64_t i) {
  return !f.flags || f.flags[f.first_row + (f.offset + static_cast<unsigned>(i - begin)) / f.row_len];
}
// A tensor with deferred rows: whether element i is updated in this step (its row was written), and if it starts
// its row, the row's last applied step becomes this one.
__device__ __forceinline__ bool deferred_row_updated(const AdamWTensor& t, const RowFlags& f, std::int64_t begin,
                                                     std::int64_t i, bool written, int step) {
  if (!written) return false;
  const unsigned in_chunk = f.offset + static_cast<unsigned>(i - begin);
  if (in_chunk % f.row_len == 0) t.row_step[f.first_row + in_chunk / f.row_len] = step;
  return true;
}

__global__ void __launch_bounds__(kThreads) sumsq_kernel(const AdamWTensor* tensors, const AdamWChunk* chunks,
                                                         double* partial) {
  const AdamWChunk c = chunks[blockIdx.x];
  const AdamWTensor t = tensors[c.tensor];
  const Range r = chunk_range(t, c);
  const RowFlags f = row_flags(t, r.begin);
  double acc = 0.0;
  for (std::int64_t i = r.begin + 4 * threadIdx.x; i < r.end4; i += 4 * kThreads) {
    if (!may_be_written(f, r.begin, i)) continue;  // zeros add nothing: the same sum
    const float4 g = *reinterpret_cast<const float4*>(t.grad + i);
    acc += double(g.x) * g.x + double(g.y) * g.y + double(g.z) * g.z + double(g.w) * g.w;
  }
  for (std::int64_t i = r.end4 + threadIdx.x; i < r.end; i += kThreads)
    if (may_be_written(f, r.begin, i)) acc += double(t.grad[i]) * t.grad[i];
  acc = block_sum_d(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(kThreads) zeros_kernel(const AdamWTensor* tensors, const AdamWChunk* chunks,
                                                        unsigned long long* count) {
  const AdamWChunk c = chunks[blockIdx.x];
  const AdamWTensor t = tensors[c.tensor];
  const Range r = chunk_range(t, c);
  const RowFlags f = row_flags(t, r.begin);
  unsigned n = 0;  // a chunk has at most kAdamWChunk elements
  for (std::int64_t i = r.begin + 4 * threadIdx.x; i < r.end4; i += 4 * kThreads) {
    if (!may_be_written(f, r.begin, i)) {
      n += 4;
      continue;
    }
    const float4 g = *reinterpret_cast<const float4*>(t.grad + i);
    n += (g.x == 0.0f) + (g.y == 0.0f) + (g.z == 0.0f) + (g.w == 0.0f);
  }
  for (std::int64_t i = r.end4 + threadIdx.x; i < r.end; i += kThreads)
    n += !may_be_written(f, r.begin, i) || t.grad[i] == 0.0f;
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
  if ((threadIdx.x & 31) == 0 && n > 0) atomicAdd(count, static_cast<unsigned long long>(n));
}

__global__ void __launch_bounds__(1024) sum_kernel(const double* partial, std::int64_t n, double* out) {
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum_d(acc);
  if (threadIdx.x == 0) *out = acc;
}

struct AdamWScalars {
  float lr, beta1, beta2, eps, step_size, bc2_sqrt, clip, decay;
};
// The one place the per-element scalars are made, for the step and for its replay on a deferred row (the decay's
// arithmetic the same in both: the same bits).
__device__ __forceinline__ AdamWScalars scalars_of(const AdamWStepScalars& s, float weight_decay) {
  return {s.lr, s.beta1, s.beta2, s.eps, s.step_size, s.bc2_sqrt, 1.0f, 1.0f - s.lr * weight_decay};
}

__device__ __forceinline__ float join(unsigned short hi, short lo) { return __uint_as_float(join_master_bits(hi, lo)); }
__device__ __forceinline__ MasterHalves split(float p) { return split_master_bits(__float_as_uint(p)); }

__device__ __forceinline__ void update(float g, float& p, float& m, float& v, const AdamWScalars& k) {
  g *= k.clip;
  p *= k.decay;
  m += (1.0f - k.beta1) * (g - m);
  v = k.beta2 * v + (1.0f - k.beta2) * g * g;
  p -= k.step_size * m / (sqrtf(v) / k.bc2_sqrt + k.eps);
}

__device__ __forceinline__ void update4(const float4& g, float4& p, float4& m, float4& v, const AdamWScalars& k) {
  update(g.x, p.x, m.x, v.x, k);
  update(g.y, p.y, m.y, v.y, k);
  update(g.z, p.z, m.z, v.z, k);
  update(g.w, p.w, m.w, v.w, k);
}

// Master weights [i, i + 4) joined from their halves (8-byte accesses: tensors start 64-element aligned, groups at
// multiples of 4), and split back.
__device__ __forceinline__ float4 load_master4(const AdamWTensor& t, std::int64_t i) {
  const ushort4 hi = *reinterpret_cast<const ushort4*>(t.weight + i);
  const short4 lo = *reinterpret_cast<const short4*>(t.weight_lo + i);
  return make_float4(join(hi.x, lo.x), join(hi.y, lo.y), join(hi.z, lo.z), join(hi.w, lo.w));
}
__device__ __forceinline__ void store_master4(const AdamWTensor& t, std::int64_t i, const float4& p) {
  const MasterHalves h0 = split(p.x), h1 = split(p.y), h2 = split(p.z), h3 = split(p.w);
  *reinterpret_cast<ushort4*>(t.weight + i) = make_ushort4(h0.hi, h1.hi, h2.hi, h3.hi);
  *reinterpret_cast<short4*>(t.weight_lo + i) = make_short4(h0.lo, h1.lo, h2.lo, h3.lo);
}

__global__ void __launch_bounds__(kThreads) adamw_kernel(const AdamWTensor* tensors, const AdamWChunk* chunks,
                                                         const double* sumsq, double max_norm, AdamWStepScalars s,
                                                         int step) {
  const AdamWChunk c = chunks[blockIdx.x];
  const AdamWTensor t = tensors[c.tensor];
  const Range r = chunk_range(t, c);
  AdamWScalars k = scalars_of(s, t.weight_decay);
  if (max_norm > 0 && sumsq) {
    const double f = max_norm / (sqrt(*sumsq) + 1e-6);
    if (f < 1.0) k.clip = static_cast<float>(f);
  }
  const RowFlags f = row_flags(t, r.begin);
  // Per 4 elements: 16-byte accesses to the gradient and the moments, 8-byte ones to the halves (every tensor
  // starts 64-element aligned and chunks start at multiples of 4 elements).
  for (std::int64_t i = r.begin + 4 * threadIdx.x; i < r.end4; i += 4 * kThreads) {
    const bool written = may_be_written(f, r.begin, i);
    if (t.row_step && !deferred_row_updated(t, f, r.begin, i, written, step)) continue;
    const float4 g = written ? *reinterpret_cast<const float4*>(t.grad + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    float4 p = load_master4(t, i);
    float4 m = *reinterpret_cast<const float4*>(t.m + i);
    float4 v = *reinterpret_cast<const float4*>(t.v + i);
    update4(g, p, m, v, k);
    store_master4(t, i, p);
    *reinterpret_cast<float4*>(t.m + i) = m;
    *reinterpret_cast<float4*>(t.v + i) = v;
    if (t.weight_f32) *reinterpret_cast<float4*>(t.weight_f32 + i) = p;
  }
  for (std::int64_t i = r.end4 + threadIdx.x; i < r.end; i += kThreads) {
    const bool written = may_be_written(f, r.begin, i);
    if (t.row_step && !deferred_row_updated(t, f, r.begin, i, written, step)) continue;
    float p = join(__bfloat16_as_ushort(t.weight[i]), t.weight_lo[i]), m = t.m[i], v = t.v[i];
    update(written ? t.grad[i] : 0.0f, p, m, v, k);
    const MasterHalves h = split(p);
    t.weight[i] = __ushort_as_bfloat16(h.hi);
    t.weight_lo[i] = h.lo;
    t.m[i] = m;
    t.v[i] = v;
    if (t.weight_f32) t.weight_f32[i] = p;
  }
}

__global__ void record_kernel(AdamWStepScalars* slot, AdamWStepScalars s) { *slot = s; }

__global__ void mark_kernel(const int* ids, int n, std::uint8_t* needed) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && ids[i] >= 0) needed[ids[i]] = 1;
}

__global__ void fill_step_kernel(int* row_step, std::int64_t rows, int step) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r < rows) row_step[r] = step;
}

// One block a row: the steps the row missed, replayed in order with g = 0 (update() with each step's scalars,
// as adamw_kernel would have applied them), the halves split once at the end (exact: join(split(p)) = p).
__global__ void __launch_bounds__(kThreads) catch_up_kernel(AdamWTensor t, std::uint8_t* needed, int current,
                                                            const AdamWStepScalars* history, int capacity) {
  const std::int64_t row = blockIdx.x;
  if (needed && !needed[row]) return;
  const int from = t.row_step[row];
  const std::int64_t begin = row * t.row_len, end = begin + t.row_len;  // row_len % 4 == 0
  for (std::int64_t i = begin + 4 * threadIdx.x; i < end && from < current; i += 4 * kThreads) {
    float4 p = load_master4(t, i);
    float4 m = *reinterpret_cast<const float4*>(t.m + i);
    float4 v = *reinterpret_cast<const float4*>(t.v + i);
    for (int s = from + 1; s <= current; ++s) {
      const AdamWStepScalars& h = history[s % capacity];
      const AdamWScalars k = scalars_of(h, h.weight_decay);
      update4(make_float4(0.f, 0.f, 0.f, 0.f), p, m, v, k);
    }
    store_master4(t, i, p);
    *reinterpret_cast<float4*>(t.m + i) = m;
    *reinterpret_cast<float4*>(t.v + i) = v;
  }
  __syncthreads();  // every thread has read row_step before it moves
  if (threadIdx.x == 0) {
    t.row_step[row] = current;
    if (needed) needed[row] = 0;
  }
}

}  // namespace

std::vector<AdamWChunk> adamw_chunks(const AdamWTensor* tensors, int count) {
  std::vector<AdamWChunk> chunks;
  for (int t = 0; t < count; ++t)
    for (std::int64_t piece = 0; piece * kAdamWChunk < tensors[t].numel; ++piece)
      chunks.push_back({t, static_cast<int>(piece)});
  return chunks;
}

void grad_sumsq(const AdamWTensor* tensors_device, const AdamWChunk* chunks, int num_chunks, double* partial,
                double* sumsq, cudaStream_t stream) {
  if (num_chunks == 0) {
    cudaMemsetAsync(sumsq, 0, sizeof(double), stream);
    return;
  }
  sumsq_kernel<<<num_chunks, kThreads, 0, stream>>>(tensors_device, chunks, partial);
  sum_kernel<<<1, 1024, 0, stream>>>(partial, num_chunks, sumsq);
}

void count_grad_zeros(const AdamWTensor* tensors_device, const AdamWChunk* chunks, int num_chunks,
                      unsigned long long* count, cudaStream_t stream) {
  cudaMemsetAsync(count, 0, sizeof(unsigned long long), stream);
  if (num_chunks > 0) zeros_kernel<<<num_chunks, kThreads, 0, stream>>>(tensors_device, chunks, count);
}

AdamWStepScalars adamw_step_scalars(float lr, float beta1, float beta2, float eps, int step, float weight_decay) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), step);
  return {lr, beta1, beta2, eps, static_cast<float>(lr / bc1), static_cast<float>(std::sqrt(bc2)), weight_decay};
}

void adamw_step(const AdamWTensor* tensors_device, const AdamWChunk* chunks, int num_chunks, const double* sumsq,
                double max_norm, float lr, float beta1, float beta2, float eps, int step, cudaStream_t stream) {
  if (num_chunks == 0) return;  // an optimizer shard of padding only
  // weight_decay is per tensor (AdamWTensor), not the step's
  adamw_kernel<<<num_chunks, kThreads, 0, stream>>>(tensors_device, chunks, sumsq, max_norm,
                                                    adamw_step_scalars(lr, beta1, beta2, eps, step, 0.0f), step);
}

void adamw_record_step(AdamWStepScalars* slot, const AdamWStepScalars& s, cudaStream_t stream) {
  record_kernel<<<1, 1, 0, stream>>>(slot, s);
}

void mark_rows(const int* ids, int n, std::uint8_t* needed, cudaStream_t stream) {
  if (n > 0) mark_kernel<<<(n + 255) / 256, 256, 0, stream>>>(ids, n, needed);
}

void adamw_catch_up(const AdamWTensor& t, std::uint8_t* needed, int current, const AdamWStepScalars* history,
                    int capacity, cudaStream_t stream) {
  const std::int64_t rows = t.numel / t.row_len;
  if (rows > 0)
    catch_up_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(t, needed, current, history, capacity);
}

void fill_row_step(int* row_step, std::int64_t rows, int step, cudaStream_t stream) {
  if (rows > 0) fill_step_kernel<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>(row_step, rows, step);
}

}  // namespace dlm::train::cuda
