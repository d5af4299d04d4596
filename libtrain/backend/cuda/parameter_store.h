// CudaModel's parameters and AdamW state: this rank's tensors in flat device buffers, each tensor at offset[p]
// (rounded up to kAlign elements; a multiple of the optimizer shards' equal ranges in all).
//   w16    bf16 [total]             the master weights' upper halves: the bf16 weights the kernels read, whole
//   w_lo   int16 [opt_numel]        their lower halves (master_split.h), the optimizer range only
//   grad   fp32 [total]             the gradients, whole (data parallelism reduce-scatters them in place)
//   m, v   fp32 [opt_numel]         AdamW's moments, the optimizer range only
//   norms32, norms_owned            whole fp32 copies of the norm weights, which the kernels read in fp32 (F(p)),
//                                   packed at norm_offset[p] (-1 for other tensors). AdamW writes its range's new
//                                   values into norms_owned: norms32 itself without shards; with shards a buffer of
//                                   the same layout, zero outside the range, summed over the ranks into norms32.
// The optimizer range is [opt_first, opt_first + opt_numel) of the flat buffers (all of them without shards); a
// tensor's part inside it is moment_part(p), indexed into w_lo, m and v by in_moments. w_lo follows w16 in one
// allocation: without shards the 4 bytes a parameter of the two are the whole master weights (parameter_buffer()).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "device_arena.h"
#include "dlm/ckpt/sharding.h"
#include "kernels.h"

namespace dlm::train::cuda {

constexpr std::int64_t kAlign = 64;  // elements: keeps every tensor 256-byte aligned

struct ParameterStore {
  std::vector<ckpt::TensorShard> specs;  // this rank's tensors, local shapes
  std::unordered_map<std::string, int> index;
  std::vector<std::int64_t> offset;
  std::int64_t total = 0, opt_first = 0, opt_numel = 0;
  int shards = 1;  // optimizer shards
  bf16* w16 = nullptr;
  std::int16_t* w_lo = nullptr;
  float *grad = nullptr, *m = nullptr, *v = nullptr;
  float *norms32 = nullptr, *norms_owned = nullptr;
  std::vector<std::int64_t> norm_offset;
  std::int64_t norm_total = 0;
  // The multi-tensor kernels' tensor list and its chunks (adamw.cu); norm_chunks: those of the tensors this rank
  // counts in the gradient norm (the ones it saves). norm_partial and sumsq: the norm's partial and whole sums;
  // zeros: the count of zero gradients over the same chunks.
  AdamWTensor* adam_dev = nullptr;
  AdamWChunk* adam_chunks = nullptr;
  int num_chunks = 0;
  AdamWChunk* norm_chunks = nullptr;
  int num_norm_chunks = 0;
  double *norm_partial = nullptr, *sumsq = nullptr;
  unsigned long long* zeros = nullptr;
  int steps = 0;  // AdamW steps taken
  cudaStream_t stream = nullptr;
  DeviceArena arena;

  // The tensors' places and the optimizer range of shard `rank` of `shards`, then every buffer, zeroed, on `st`.
  void allocate(std::vector<ckpt::TensorShard> tensors, int shards, int rank, cudaStream_t st);

  std::int64_t numel(int p) const {
    std::int64_t n = 1;
    for (auto s : specs[static_cast<std::size_t>(p)].local_shape) n *= s;
    return n;
  }
  // Tensor p's room in a flat buffer: its elements rounded up to kAlign.
  std::int64_t aligned_numel(int p) const { return (numel(p) + kAlign - 1) / kAlign * kAlign; }
  int find(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? -1 : it->second;
  }
  int find_or_fail(std::string_view name) const;  // dlm::Error for a name this rank does not hold
  bool sharded() const { return shards > 1; }
  const bf16* W(int p) const { return w16 + offset[p]; }
  // The fp32 weights of norm tensor p as the kernels read them, whole on every rank.
  const float* F(int p) const { return norms32 + norm_offset[p]; }
  float* G(int p) const { return grad + offset[p]; }

  // The part of tensor p inside the optimizer's range (all of it without shards), as (element of p, element
  // of the moment buffers, count); count 0 when the range misses it.
  struct MomentPart {
    std::int64_t in_tensor = 0, in_moments = 0, numel = 0;
  };
  MomentPart moment_part(int p) const;
  // The tensor list the multi-tensor kernels walk: each tensor's part inside the optimizer's range, in model
  // order, tensors the range misses left out; weight decay is per call (the options may change).
  std::vector<AdamWTensor> adam_list(double weight_decay) const;
  // Tensor p's whole (local) fp32 values in device memory become its weights: the bf16 upper halves of all of
  // them, the lower halves of the part in the optimizer range and, for a norm, its fp32 copies.
  void set_weights(int p, const float* values);
  // Tensor p's master weights (the halves joined) in the optimizer range, zeros outside it (with shards the
  // ranks' exports sum to the whole tensor).
  std::vector<float> export_master(int p) const;
  // Tensor p's values from a buffer of the optimizer range (m or v), zeros outside the range.
  std::vector<float> export_part(int p, const float* range_buffer) const;

  // For checkpoints: every tensor's export_master(p), or its export_part(p, m) and export_part(p, v), in model
  // order, with the same values. The optimizer range's buffers come to pinned host memory in one device->host
  // copy each and the tensors are filled from there on host threads. The pinned buffers (4 bytes an element of
  // the range for the master weights, 8 for the moments) are allocated at the first call and kept until
  // release_pinned(): only processes that save hold them.
  std::vector<std::vector<float>> export_masters();
  void export_moments(std::vector<std::vector<float>>& exp_avg, std::vector<std::vector<float>>& exp_avg_sq);
  void release_pinned() { pinned_master.reset(), pinned_moments.reset(); }
  struct FreeHost {
    void operator()(std::byte* p) const { cudaFreeHost(p); }
  };
  using Pinned = std::unique_ptr<std::byte, FreeHost>;
  Pinned pinned_master, pinned_moments;
  std::byte* pinned(Pinned& buffer, std::size_t bytes_per_element) const;  // allocated at the first call
};

}  // namespace dlm::train::cuda
