// cuDNN SDPA graphs, built once per (shape, causal) and cached: q, k, v are strided views of the attention
// layout, so no copy is made ([B, H, S, D] with strides [S * ld, D, ld, 1], ld = (H + 2G) * D; k and v start
// H * D and (H + G) * D into the row). Stats are cuDNN's softmax statistics in natural log, the lse the own
// kernels write, in the same [B, H, S] order. Without DLM_HAVE_CUDNN this file only forwards to attention.cu.
#include "attention_cudnn.h"

#include <cmath>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "dlm/common/error.h"

#if DLM_HAVE_CUDNN
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace dlm::train::cuda {

#if DLM_HAVE_CUDNN
namespace fe = cudnn_frontend;

namespace {
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

using Key = std::tuple<int, int, int, int, int, bool, bool>;

struct Graphs {
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  std::string error;  // non-empty: cuDNN declined this shape, the own kernels run it
};

std::string why(const char* stage, fe::error_t e) { return fmt::format("{}: {}", stage, e.get_message()); }

// Where group 0's v starts in a token's row of the projection's grouped layout ([its q heads | k | v] per group).
std::int64_t grouped_v_offset(const AttentionShape& s) { return std::int64_t(s.heads / s.groups + 1) * s.head_dim; }
}  // namespace

struct Attention::Impl {
  bool own = false, deterministic = false;
  cudnnHandle_t handle = nullptr;
  std::map<Key, Graphs> cache;
  void* workspace = nullptr;
  std::size_t ws_bytes = 0;
  std::string last = "own kernel";

  ~Impl() {
    if (workspace) cudaFree(workspace);
    if (handle) cudnnDestroy(handle);
  }

  void reserve(std::int64_t bytes) {
    if (bytes <= static_cast<std::int64_t>(ws_bytes)) return;
    if (workspace) check_cuda(cudaFree(workspace), "cudnn workspace");
    workspace = nullptr;
    check_cuda(cudaMalloc(&workspace, static_cast<std::size_t>(bytes)), "cudnn workspace");
    ws_bytes = static_cast<std::size_t>(bytes);
  }

  // Tensors of the attention layout as strided 4-D views; with v_grouped, V (and dV) as the view of the
  // projection's grouped layout instead: group g's v at grouped_v_offset + g (per + 2) D of a token's row.
  static std::vector<std::int64_t> v_stride(const AttentionShape& s, bool v_grouped) {
    const std::int64_t D = s.head_dim, ld = std::int64_t(s.heads + 2 * s.groups) * D;
    const std::int64_t group_stride = v_grouped ? (s.heads / s.groups + 2) * D : D;
    return {s.seq * ld, group_stride, ld, 1};
  }
  static void qkv_views(fe::graph::Graph& g, const AttentionShape& s, bool v_grouped,
                        std::shared_ptr<fe::graph::Tensor_attributes>* q,
                        std::shared_ptr<fe::graph::Tensor_attributes>* k,
                        std::shared_ptr<fe::graph::Tensor_attributes>* v) {
    const std::int64_t D = s.head_dim, S = s.seq, ld = std::int64_t(s.heads + 2 * s.groups) * D;
    using TA = fe::graph::Tensor_attributes;
    *q = g.tensor(TA().set_name("Q").set_uid(kQ).set_dim({s.batch, s.heads, S, D}).set_stride({S * ld, D, ld, 1}));
    *k = g.tensor(TA().set_name("K").set_uid(kK).set_dim({s.batch, s.groups, S, D}).set_stride({S * ld, D, ld, 1}));
    *v = g.tensor(TA().set_name("V").set_uid(kV).set_dim({s.batch, s.groups, S, D}).set_stride(v_stride(s, v_grouped)));
  }
  static std::vector<std::int64_t> o_stride(const AttentionShape& s) {
    const std::int64_t HD = std::int64_t(s.heads) * s.head_dim;
    return {s.seq * HD, s.head_dim, HD, 1};
  }
  static std::vector<std::int64_t> o_dim(const AttentionShape& s) { return {s.batch, s.heads, s.seq, s.head_dim}; }
  static std::vector<std::int64_t> stats_dim(const AttentionShape& s) { return {s.batch, s.heads, s.seq, 1}; }
  static std::vector<std::int64_t> stats_stride(const AttentionShape& s) {
    return {std::int64_t(s.heads) * s.seq, s.seq, 1, 1};
  }

  static std::shared_ptr<fe::graph::Graph> new_graph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
  }

  std::string build(fe::graph::Graph& g) {
    if (auto e = g.validate(); e.is_bad()) return why("validate", e);
    if (auto e = g.build_operation_graph(handle); e.is_bad()) return why("operation graph", e);
    if (auto e = g.create_execution_plans({fe::HeurMode_t::A}); e.is_bad()) return why("plans", e);
    if (auto e = g.check_support(handle); e.is_bad()) return why("support", e);
    if (auto e = g.build_plans(handle); e.is_bad()) return why("build", e);
    std::int64_t ws = 0;
    if (auto e = g.get_workspace_size(ws); e.is_bad()) return why("workspace", e);
    reserve(ws);
    return {};
  }

  Graphs& graphs(const AttentionShape& s, bool v_grouped) {
    const Key key{s.batch, s.seq, s.heads, s.groups, s.head_dim, s.causal, v_grouped};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Graphs& out = cache[key];
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    using TA = fe::graph::Tensor_attributes;
    {
      auto g = new_graph();
      std::shared_ptr<TA> q, k, v;
      qkv_views(*g, s, v_grouped, &q, &k, &v);
      auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(scale);
      if (s.causal) opts.set_causal_mask(true);
      auto [o, stats] = g->sdpa(q, k, v, opts);
      o->set_output(true).set_uid(kO).set_dim(o_dim(s)).set_stride(o_stride(s));
      stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dim(s)).set_stride(
          stats_stride(s));
      out.error = build(*g);
      if (!out.error.empty()) return out;
      out.fwd = g;
    }
    {
      auto g = new_graph();
      std::shared_ptr<TA> q, k, v;
      qkv_views(*g, s, v_grouped, &q, &k, &v);
      auto o = g->tensor(TA().set_name("O").set_uid(kO).set_dim(o_dim(s)).set_stride(o_stride(s)));
      auto dout = g->tensor(TA().set_name("dO").set_uid(kdO).set_dim(o_dim(s)).set_stride(o_stride(s)));
      auto stats = g->tensor(TA().set_name("Stats").set_uid(kStats).set_dim(stats_dim(s)).set_stride(stats_stride(s))
                                 .set_data_type(fe::DataType_t::FLOAT));
      auto opts = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(scale);
      if (s.causal) opts.set_causal_mask(true);
      if (deterministic) opts.set_deterministic_algorithm(true);
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
      const std::int64_t D = s.head_dim, S = s.seq, ld = std::int64_t(s.heads + 2 * s.groups) * D;
      dq->set_output(true).set_uid(kdQ).set_dim({s.batch, s.heads, S, D}).set_stride({S * ld, D, ld, 1});
      dk->set_output(true).set_uid(kdK).set_dim({s.batch, s.groups, S, D}).set_stride({S * ld, D, ld, 1});
      dv->set_output(true).set_uid(kdV).set_dim({s.batch, s.groups, S, D}).set_stride(v_stride(s, v_grouped));
      out.error = build(*g);
      if (!out.error.empty()) {
        out.fwd.reset();
        return out;
      }
      out.bwd = g;
    }
    return out;
  }

  // false: the own kernels must run this shape.
  bool usable(const AttentionShape& s, bool v_grouped) {
    if (own) return false;
    if (!handle) {
      if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
        own = true;
        last = "own kernel (cudnnCreate failed)";
        return false;
      }
    }
    const Graphs& g = graphs(s, v_grouped);
    if (!g.error.empty()) {
      last = "own kernel (cuDNN declined: " + g.error + ")";
      return false;
    }
    last = fmt::format("cudnn {}{}", cudnnGetVersion(), deterministic ? " deterministic" : "");
    return true;
  }

  void run(const fe::graph::Graph& g, std::unordered_map<std::int64_t, void*>& pack, cudaStream_t stream) {
    if (cudnnSetStream(handle, stream) != CUDNN_STATUS_SUCCESS) fail("attention: cudnnSetStream failed");
    if (auto e = g.execute(handle, pack, workspace); e.is_bad()) fail("attention: cuDNN execute: " + e.get_message());
  }
};

Attention::Attention(Engine engine, bool deterministic) : impl_(std::make_unique<Impl>()) {
  impl_->own = engine == Engine::kOwn;
  impl_->deterministic = deterministic;
}

bool Attention::reads_v_from_projection(const AttentionShape& s) { return impl_->usable(s, true); }

void Attention::forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, cudaStream_t stream) {
  forward(s, qkv, nullptr, o, lse, stream);
}

void Attention::forward(const AttentionShape& s, const bf16* qkv, const bf16* proj, bf16* o, float* lse,
                        cudaStream_t stream) {
  auto& I = *impl_;
  const bool grouped = proj && reads_v_from_projection(s);
  if (!grouped && !I.usable(s, false)) return attention_forward(s, qkv, o, lse, stream);
  const std::int64_t D = s.head_dim;
  auto* base = const_cast<bf16*>(qkv);
  bf16* v = grouped ? const_cast<bf16*>(proj) + grouped_v_offset(s) : base + (s.heads + s.groups) * D;
  std::unordered_map<std::int64_t, void*> pack{{kQ, base}, {kK, base + s.heads * D}, {kV, v}, {kO, o}, {kStats, lse}};
  I.run(*I.graphs(s, grouped).fwd, pack, stream);
}

void Attention::backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout, const float* lse,
                         float* delta, bf16* dqkv, cudaStream_t stream) {
  backward(s, qkv, nullptr, o, dout, lse, delta, dqkv, nullptr, stream);
}

void Attention::backward(const AttentionShape& s, const bf16* qkv, const bf16* proj, const bf16* o, const bf16* dout,
                         const float* lse, float* delta, bf16* dqkv, bf16* dproj, cudaStream_t stream) {
  auto& I = *impl_;
  const bool grouped = proj && dproj && reads_v_from_projection(s);
  if (!grouped && !I.usable(s, false)) return attention_backward(s, qkv, o, dout, lse, delta, dqkv, stream);
  const std::int64_t D = s.head_dim, kofs = s.heads * D, vofs = (s.heads + s.groups) * D;
  auto* base = const_cast<bf16*>(qkv);
  bf16* v = grouped ? const_cast<bf16*>(proj) + grouped_v_offset(s) : base + vofs;
  bf16* dv = grouped ? dproj + grouped_v_offset(s) : dqkv + vofs;
  std::unordered_map<std::int64_t, void*> pack{
      {kQ, base},        {kK, base + kofs},        {kV, v},
      {kO, const_cast<bf16*>(o)}, {kdO, const_cast<bf16*>(dout)}, {kStats, const_cast<float*>(lse)},
      {kdQ, dqkv},       {kdK, dqkv + kofs},       {kdV, dv}};
  I.run(*I.graphs(s, grouped).bwd, pack, stream);
}

std::size_t Attention::workspace_bytes() const { return impl_->ws_bytes; }
std::string Attention::engine() const { return impl_->last; }

#else  // no cuDNN frontend at build time

struct Attention::Impl {};

Attention::Attention(Engine, bool) : impl_(std::make_unique<Impl>()) {}

void Attention::forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, cudaStream_t stream) {
  attention_forward(s, qkv, o, lse, stream);
}

void Attention::backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout, const float* lse,
                         float* delta, bf16* dqkv, cudaStream_t stream) {
  attention_backward(s, qkv, o, dout, lse, delta, dqkv, stream);
}

bool Attention::reads_v_from_projection(const AttentionShape&) { return false; }

void Attention::forward(const AttentionShape& s, const bf16* qkv, const bf16*, bf16* o, float* lse,
                        cudaStream_t stream) {
  attention_forward(s, qkv, o, lse, stream);
}

void Attention::backward(const AttentionShape& s, const bf16* qkv, const bf16*, const bf16* o, const bf16* dout,
                         const float* lse, float* delta, bf16* dqkv, bf16*, cudaStream_t stream) {
  attention_backward(s, qkv, o, dout, lse, delta, dqkv, stream);
}

std::size_t Attention::workspace_bytes() const { return 0; }
std::string Attention::engine() const { return "own kernel (built without cudnn-frontend)"; }

#endif

Attention::~Attention() = default;

}  // namespace dlm::train::cuda
