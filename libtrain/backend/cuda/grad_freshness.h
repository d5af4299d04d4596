// Which gradients zero_grad() left to be overwritten rather than cleared. The gradients the weight GEMMs write
// whole (qkv, proj, fc1, fc2, an untied output layer: gemm_written) are not cleared: zero_grad marks them fresh,
// and the first GEMM into each afterwards overwrites (beta 0) instead of adding, as PyTorch's set_to_none lets it
// do, which saves a memset of 4 bytes a parameter. The host's flags follow enqueue order, which is the stream's.
// The other tensors (norms, the embedding) are cleared: zero_runs, contiguous [offset, count) spans of the flat
// gradient buffer; the sparse embedding's rows are cleared by their flags instead (DeferredEmbeddingRows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "parameter_store.h"

namespace dlm::train::cuda {

struct GradientFreshness {
  std::vector<char> fresh, gemm_written;  // per tensor
  std::vector<std::pair<std::int64_t, std::int64_t>> zero_runs;

  // The spans zero_grad clears: every tensor but the GEMM-written ones and `skip` (-1: none).
  void build_zero_runs(const ParameterStore& params, int skip) {
    zero_runs.clear();
    for (std::size_t i = 0; i < params.specs.size(); ++i) {
      if (gemm_written[i] || static_cast<int>(i) == skip) continue;
      const std::int64_t first = params.offset[i], count = params.aligned_numel(static_cast<int>(i));
      if (!zero_runs.empty() && zero_runs.back().first + zero_runs.back().second == first)
        zero_runs.back().second += count;
      else
        zero_runs.emplace_back(first, count);
    }
  }
  // zero_grad's clears, enqueued on `stream`.
  void zero(const ParameterStore& params, cudaStream_t stream) {
    for (const auto& [first, count] : zero_runs)
      check_cuda(cudaMemsetAsync(params.grad + first, 0, sizeof(float) * count, stream), "zero_grad");
    fresh = gemm_written;
  }
  // The beta of the next GEMM into tensor p's gradient: 0 (overwrite) for the first after zero_grad.
  float beta(int p) {
    if (!fresh[static_cast<std::size_t>(p)]) return 1.0f;
    fresh[static_cast<std::size_t>(p)] = 0;
    return 0.0f;
  }
  // Clears what is still fresh (a GEMM that did not run since zero_grad), before anything reads the gradient.
  void settle(int p, const ParameterStore& params, cudaStream_t stream) {
    if (!fresh[static_cast<std::size_t>(p)]) return;
    check_cuda(cudaMemsetAsync(params.G(p), 0, sizeof(float) * params.numel(p), stream), "memset");
    fresh[static_cast<std::size_t>(p)] = 0;
  }
  void settle_all(const ParameterStore& params, cudaStream_t stream) {
    for (std::size_t i = 0; i < fresh.size(); ++i) settle(static_cast<int>(i), params, stream);
  }
};

}  // namespace dlm::train::cuda
