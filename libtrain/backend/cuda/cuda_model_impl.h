// CudaModel's state, shared by the files that implement it (cuda_model.cpp: allocation and the step;
// cuda_model_optimizer.cpp: the norm, AdamW and the optimizer state's import/export).
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "attention_cudnn.h"
#include "dlm/common/error.h"
#include "dlm/train/cuda_model.h"
#include "gemm.h"
#include "kernels.h"
#include "phase_timer.h"

namespace dlm::train {

using namespace dlm::train::cuda;

namespace cuda_detail {

constexpr std::int64_t kAlign = 64;  // elements: keeps every tensor 256-byte aligned
constexpr std::size_t kLogitsBudget = std::size_t{3} << 29;  // bf16 logits of one chunk, bytes

struct LayerParams {
  int ln1, qkv, qn, kn, proj, ln2, fc1, fc2;
};
struct LayerActs {
  bf16 *res1, *h1, *qkv_raw, *qkv_rot, *att, *res2, *h2, *gu, *act;
  float *rstd1, *qk_rstd, *lse, *rstd2;
};

}  // namespace cuda_detail

using namespace cuda_detail;

struct CudaModel::Impl {
  PhaseTimer timer;
  ckpt::ModelConfig cfg;
  std::vector<ckpt::TensorSpec> specs;
  std::vector<std::int64_t> offset;
  std::unordered_map<std::string, int> index;
  std::int64_t total = 0;
  std::vector<void*> owned, acts_owned;
  std::size_t bytes = 0, act_bytes = 0;
  float *master = nullptr, *grad = nullptr, *m = nullptr, *v = nullptr;
  bf16* w16 = nullptr;
  float *rope_cos = nullptr, *rope_sin = nullptr;
  AdamWTensor* adam_dev = nullptr;
  AdamWChunk* adam_chunks = nullptr;
  int num_chunks = 0;
  double *norm_partial = nullptr, *sumsq = nullptr;
  int steps = 0;
  cudaStream_t stream = nullptr;
  std::function<void(int)> layer_hook;  // set_backward_layer_hook
  std::unique_ptr<Gemm> gemm;
  std::unique_ptr<Attention> attention;
  std::vector<LayerParams> lp;
  int emb = -1, lnf = -1, out = -1;
  // activations for T = B * S tokens
  std::int64_t B = 0, S = 0, T = 0, chunk = 0;
  std::vector<LayerActs> la;
  bf16 *tmp = nullptr, *res_f = nullptr, *hf = nullptr, *logits = nullptr, *dres16 = nullptr, *dh = nullptr;
  bf16 *dact = nullptr, *dgu = nullptr, *datt = nullptr, *dqkv_rot = nullptr, *dqkv = nullptr;
  float *rstd_f = nullptr, *dres = nullptr, *delta = nullptr, *partial = nullptr, *loss_rows = nullptr;
  float* weights = nullptr;
  int *ids = nullptr, *labels = nullptr, *pos = nullptr, *order = nullptr;
  EmbeddingSegment* emb_segments = nullptr;
  EmbeddingCombine* emb_combine = nullptr;
  float* emb_partial = nullptr;

  template <typename T>
  T* alloc(std::int64_t n, std::vector<void*>& list, std::size_t& counter) {
    void* p = nullptr;
    const auto size = static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(T);
    check_cuda(cudaMalloc(&p, size), "cudaMalloc");
    list.push_back(p);
    counter += size;
    return static_cast<T*>(p);
  }
  template <typename T>
  T* act(std::int64_t n) { return alloc<T>(n, acts_owned, act_bytes); }

  int d() const { return cfg.hidden_size; }
  int ffn() const { return cfg.ffn_hidden_size; }
  int qdim() const { return static_cast<int>(cfg.q_size()); }
  int qkvdim() const { return static_cast<int>(cfg.q_size() + 2 * cfg.kv_size()); }
  int vpad() const { return static_cast<int>(cfg.padded_vocab_size()); }
  const bf16* W(int p) const { return w16 + offset[p]; }
  float* F(int p) const { return master + offset[p]; }
  float* G(int p) const { return grad + offset[p]; }
  int find(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? -1 : it->second;
  }

  // Forward graphs of the sampling path (run_graphed), per shape; they hold activation and workspace
  // pointers, so they go whenever those move. DLM_CUDA_GRAPHS=0 or the profiler turns them off.
  struct ForwardGraph {
    std::int64_t batch, seq;
    bool causal;
    std::size_t workspace;
    cudaGraphExec_t exec;
  };
  std::vector<ForwardGraph> graphs;
  std::vector<ForwardGraph> seen;  // shapes run once eagerly (their per-shape plans are built)
  bool graphs_off = false;

  void clear_graphs() {
    for (auto& g : graphs) cudaGraphExecDestroy(g.exec);
    graphs.clear();
    seen.clear();
  }

  template <typename Enqueue>
  void run_graphed(std::int64_t batch, std::int64_t seq, bool causal, Enqueue&& enqueue) {
    if (graphs_off || timer.enabled()) return enqueue();
    const std::size_t ws = attention->workspace_bytes();
    for (std::size_t i = 0; i < graphs.size(); ++i) {
      auto& g = graphs[i];
      if (g.batch != batch || g.seq != seq || g.causal != causal) continue;
      if (g.workspace == ws) return check_cuda(cudaGraphLaunch(g.exec, stream), "graph launch");
      cudaGraphExecDestroy(g.exec);
      graphs.erase(graphs.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
    const auto same = [&](const ForwardGraph& g) { return g.batch == batch && g.seq == seq && g.causal == causal; };
    if (std::none_of(seen.begin(), seen.end(), same)) {
      seen.push_back({batch, seq, causal, ws, nullptr});
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
      graphs_off = true;
      return enqueue();
    }
    check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check_cuda(made, "graph instantiate");
    graphs.push_back({batch, seq, causal, ws, exec});
    check_cuda(cudaGraphLaunch(exec, stream), "graph launch");
  }

  void free_acts() {
    clear_graphs();
    for (void* p : acts_owned) cudaFree(p);
    acts_owned.clear();
    act_bytes = 0;
    la.clear();
    T = 0;
  }

  void ensure_acts(std::int64_t batch, std::int64_t seq) {
    if (batch == B && seq == S && T > 0) return;
    free_acts();
    B = batch, S = seq, T = batch * seq;
    const std::int64_t heads = cfg.num_attention_heads, norms = heads + cfg.num_query_groups;
    la.resize(static_cast<std::size_t>(cfg.num_layers));
    for (auto& a : la) {
      a.res1 = act<bf16>(T * d()), a.h1 = act<bf16>(T * d()), a.qkv_raw = act<bf16>(T * qkvdim());
      a.qkv_rot = act<bf16>(T * qkvdim()), a.att = act<bf16>(T * qdim()), a.res2 = act<bf16>(T * d());
      a.h2 = act<bf16>(T * d()), a.gu = act<bf16>(T * 2 * ffn()), a.act = act<bf16>(T * ffn());
      a.rstd1 = act<float>(T), a.qk_rstd = act<float>(T * norms), a.lse = act<float>(T * heads), a.rstd2 = act<float>(T);
    }
    chunk = std::min<std::int64_t>(T, std::max<std::int64_t>(64, static_cast<std::int64_t>(kLogitsBudget / (2 * vpad())) / 64 * 64));
    tmp = act<bf16>(T * d()), res_f = act<bf16>(T * d()), hf = act<bf16>(T * d()), dres16 = act<bf16>(T * d());
    dh = act<bf16>(T * d()), logits = act<bf16>(chunk * vpad()), dact = act<bf16>(T * ffn());
    dgu = act<bf16>(T * 2 * ffn()), datt = act<bf16>(T * qdim()), dqkv_rot = act<bf16>(T * qkvdim());
    dqkv = act<bf16>(T * qkvdim());
    rstd_f = act<float>(T), dres = act<float>(T * d()), delta = act<float>(T * heads), loss_rows = act<float>(T);
    QkvShape qs{static_cast<int>(T), cfg.num_attention_heads, cfg.num_query_groups, cfg.kv_channels, cfg.qk_layernorm, 0};
    partial = act<float>(std::max(rmsnorm_partial_floats(static_cast<int>(T), d()), qk_norm_partial_floats(qs)));
    weights = act<float>(T), ids = act<int>(T), labels = act<int>(T), pos = act<int>(T);
    order = act<int>(T), emb_segments = act<EmbeddingSegment>(embedding_plan_segments(static_cast<int>(T)));
    emb_combine = act<EmbeddingCombine>(embedding_plan_slots(static_cast<int>(T)));
    emb_partial = act<float>(embedding_plan_slots(static_cast<int>(T)) * d());
  }

  void refresh_bf16(int p) {
    f32_to_bf16(F(p), w16 + offset[p], numel(p), stream);
    check_cuda(cudaGetLastError(), "f32_to_bf16");
  }
  std::int64_t numel(int p) const {
    std::int64_t n = 1;
    for (auto s : specs[static_cast<std::size_t>(p)].shape) n *= s;
    return n;
  }
  int find_or_fail(std::string_view name) const {
    const int p = find(std::string(name));
    if (p < 0) fail(fmt::format("CudaModel: no parameter '{}'", name));
    return p;
  }
  // The tensor list the multi-tensor kernels walk; weight decay is per call (the options may change).
  std::vector<AdamWTensor> adam_list(double weight_decay) const {
    std::vector<AdamWTensor> list;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const int p = static_cast<int>(i);
      list.push_back({F(p), G(p), m + offset[i], v + offset[i], w16 + offset[i], numel(p),
                      specs[i].is_norm ? 0.0f : static_cast<float>(weight_decay)});
    }
    return list;
  }
  void upload_adam_list(double weight_decay) {
    const std::vector<AdamWTensor> list = adam_list(weight_decay);
    check_cuda(cudaMemcpyAsync(adam_dev, list.data(), list.size() * sizeof(AdamWTensor), cudaMemcpyHostToDevice, stream),
               "adamw list");
  }
};

inline std::vector<float> download(const float* src, std::int64_t n, cudaStream_t stream) {
  std::vector<float> out(static_cast<std::size_t>(n));
  check_cuda(cudaMemcpyAsync(out.data(), src, out.size() * 4, cudaMemcpyDeviceToHost, stream), "export");
  check_cuda(cudaStreamSynchronize(stream), "export");
  return out;
}

}  // namespace dlm::train
