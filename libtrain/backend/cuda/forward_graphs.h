// The samplers' forward captured as CUDA graphs, one per shape: a shape's first call runs eagerly (its per-shape
// plans are built), its second is captured and every later one replays the graph. A graph holds activation and
// workspace pointers, so the cache is cleared whenever those move (CudaModel's activations are reallocated) and a
// graph whose attention workspace has changed is captured again. Something that cannot be captured turns the cache
// off for good (the forward then runs eagerly).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <vector>

#include "cuda_check.h"

namespace dlm::train::cuda {

class ForwardGraphCache {
 public:
  // The batch, how many columns of a row reach the output layer (not where: their rows are gathered by index on the
  // device), and the KV cache's use (CudaModel's KvCacheUse: its mode, the store's serial, the columns run).
  struct Shape {
    std::int64_t batch, seq;
    bool causal;
    std::int64_t head;
    int kv_mode;
    std::uint64_t kv_store;
    std::int64_t kv_width;
    bool operator==(const Shape&) const = default;
  };
  // off: CudaOptions::cuda_graphs false.
  explicit ForwardGraphCache(bool off = false) : off_(off) {}
  ~ForwardGraphCache() { clear(); }
  ForwardGraphCache(const ForwardGraphCache&) = delete;
  ForwardGraphCache& operator=(const ForwardGraphCache&) = delete;

  void clear() {
    for (auto& g : graphs_) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
    seen_.clear();
  }

  // Runs enqueue() on `stream`, eagerly or as the shape's graph; `workspace` is the attention workspace's size now.
  // eager: run eagerly this time (the profiler's events cannot be replayed).
  template <typename Enqueue>
  void run(const Shape& shape, std::size_t workspace, bool eager, cudaStream_t stream, Enqueue&& enqueue) {
    if (off_ || eager) return enqueue();
    for (std::size_t i = 0; i < graphs_.size(); ++i) {
      auto& g = graphs_[i];
      if (!(g.shape == shape)) continue;
      if (g.workspace == workspace) return check_cuda(cudaGraphLaunch(g.exec, stream), "graph launch");
      cudaGraphExecDestroy(g.exec);
      graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
    const auto same = [&](const Graph& g) { return g.shape == shape; };
    if (std::none_of(seen_.begin(), seen_.end(), same)) {
      seen_.push_back({shape, workspace, nullptr});
      return enqueue();
    }
    cudaGraph_t graph = nullptr;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    try {
      enqueue();
    } catch (const std::exception&) {
      // Something in the forward cannot be captured: end the capture, run eagerly from now on.
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      off_ = true;
      return enqueue();
    }
    check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check_cuda(made, "graph instantiate");
    graphs_.push_back({shape, workspace, exec});
    check_cuda(cudaGraphLaunch(exec, stream), "graph launch");
  }

 private:
  struct Graph {
    Shape shape;
    std::size_t workspace;
    cudaGraphExec_t exec;
  };
  std::vector<Graph> graphs_;
  std::vector<Graph> seen_;  // shapes run once eagerly
  bool off_ = false;
};

}  // namespace dlm::train::cuda
