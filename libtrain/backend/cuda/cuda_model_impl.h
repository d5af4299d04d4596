// CudaModel's state, shared by the files that implement it (cuda_model.cpp: allocation, parameters and the
// samplers' forward; cuda_model_stage.cpp: a training step's stages and their collectives;
// cuda_model_optimizer.cpp: the norm, AdamW and the optimizer state's import/export).
#pragma once

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "attention_cudnn.h"
#include "dlm/common/error.h"
#include "dlm/train/cuda_memory_plan.h"
#include "dlm/train/cuda_model.h"
#include "gemm.h"
#include "kernels.h"
#include "phase_timer.h"
#include "swiglu_gemm.h"
#include "upload_staging.h"

namespace dlm::train {

using namespace dlm::train::cuda;

namespace cuda_detail {

constexpr std::int64_t kAlign = 64;  // elements: keeps every tensor 256-byte aligned
// bf16 logits of one chunk, bytes (the dry run's plan counts the same: cuda_memory_plan.h; so do the
// buffers below, one by one: a change here is a change there)
constexpr std::size_t kLogitsBudget = static_cast<std::size_t>(kCudaLogitsBudget);

struct LayerParams {
  int ln1, qkv, qn, kn, proj, ln2, fc1, fc2;
};
// What one layer keeps for its backward. res1/res2 (the residual stream entering each norm) and the rstds
// hold the rank's rows (1/TP of them under SP); h1/h2 (the GEMMs' normed inputs) every row, gathered.
struct LayerActs {
  bf16 *res1, *h1, *qkv_raw, *qkv_rot, *att, *res2, *h2, *gu, *act;
  float *rstd1, *qk_rstd, *lse, *rstd2;
};

// Rows the output layer runs on are padded to a multiple of this (weight-0 copies of row 0): the logits
// GEMMs see few distinct shapes, each with whole tiles.
constexpr int kHeadRowQuantum = 128;

// One micro-batch's columns on the device (ids as this rank's vocabulary rows: -1 for another's).
// The output layer runs on the rows that carry loss weight only (the masked ones of the diffusion objective,
// about half): when head_packed, labels, weights and loss_rows hold head_count packed rows, head_rows names
// the row of each and head_slot each row's place (-1: none); otherwise head_count is every row.
struct MicroInputs {
  int *ids, *labels, *pos, *order, *head_rows, *head_slot;
  float *weights, *loss_rows;
  EmbeddingSegment* segments;
  EmbeddingCombine* combine;
  int num_segments = 0, num_combine = 0, head_count = 0;
  bool causal = false, head_packed = false;
};

}  // namespace cuda_detail

using namespace cuda_detail;

struct CudaModel::Impl {
  explicit Impl(const CudaOptions& o) : options(o), timer(o.profile) {}
  CudaOptions options;
  PhaseTimer timer;
  ckpt::ModelConfig cfg;
  CudaShard shard;
  std::vector<ckpt::TensorShard> specs;  // this rank's tensors, local shapes
  // The part of the model this rank runs: tensor-parallel size and local widths, its layers, its ends.
  int tp = 1, heads = 0, groups = 0, ffn_local = 0, first_layer = 0, layers = 0;
  std::int64_t vocab_first = 0, vocab_local = 0;  // padded-vocabulary rows [first, first + vpad()) held, real ones
  bool sp = false, pre = true, post = true;
  std::vector<std::int64_t> offset;
  std::unordered_map<std::string, int> index;
  std::int64_t total = 0;
  std::int64_t opt_first = 0, opt_numel = 0;  // the optimizer's range of the flat buffers (CudaShard)
  std::vector<void*> owned, acts_owned;
  std::size_t bytes = 0, act_bytes = 0;
  // The master weights as two halves (master_split.h): w16, the upper ones, is the bf16 weights the kernels
  // read, whole (total elements); w_lo, the lower ones, only the optimizer's range, indexed by
  // moment_part(p).in_moments like m and v. One allocation, w_lo right after w16: without shards its 4 bytes a
  // parameter are the whole master weights (parameter_buffer()). grad spans the flat buffer.
  float *grad = nullptr, *m = nullptr, *v = nullptr;
  bf16* w16 = nullptr;
  std::int16_t* w_lo = nullptr;
  // Whole fp32 copies of the norm weights, which the kernels read in fp32 (F(p)); packed, each at norm_offset[p]
  // (-1 for other tensors). AdamW writes the new values of its range into norms_owned: norms32 itself without
  // shards; with shards a buffer of the same layout, zero outside the rank's range, which share_updated_weights()
  // sums over the ranks into norms32.
  float *norms32 = nullptr, *norms_owned = nullptr;
  std::vector<std::int64_t> norm_offset;
  std::int64_t norm_total = 0;
  float *rope_cos = nullptr, *rope_sin = nullptr;
  AdamWTensor* adam_dev = nullptr;
  AdamWChunk* adam_chunks = nullptr;
  int num_chunks = 0;
  AdamWChunk* norm_chunks = nullptr;  // the chunks of the tensors this rank counts in the gradient norm
  int num_norm_chunks = 0;
  double *norm_partial = nullptr, *sumsq = nullptr;
  int steps = 0;
  cudaStream_t stream = nullptr;
  bool owns_stream = true;  // false when CudaShard::stream was given
  std::function<void(int)> layer_hook;  // set_backward_layer_hook
  std::unique_ptr<Gemm> gemm;
  std::unique_ptr<SwigluBackwardGemm> swiglu_gemm;  // the fc2 data GEMM with SwiGLU's backward fused
  std::unique_ptr<Attention> attention;
  std::vector<LayerParams> lp;  // this rank's layers
  int emb = -1, lnf = -1, out = -1;
  // Activations for T = B * S tokens, Ts of them this rank's rows (T / TP under SP).
  std::int64_t B = 0, S = 0, T = 0, Ts = 0, chunk = 0;
  std::vector<std::vector<LayerActs>> slots;  // per micro-batch in flight
  // Full activation recomputation (--recompute-granularity full, set_recompute_layers): each layer of a slot
  // keeps only its input (res1); every other buffer of its LayerActs is `work`'s, one layer's worth shared by
  // all layers and slots, which the backward refills by running the layer's forward again before its backward.
  bool recompute = false;
  LayerActs work{};
  std::vector<MicroInputs> inputs;            // per micro-batch of a step
  // The last stage's head inputs per activation slot: the final norm's input and output and its rstd. A
  // schedule may run several forwards before their backwards (interleaved 1F1B with as many micro-batches as
  // stages runs every forward first). Slot 0's are ensure_acts' buffers; use_head(slot) points res_f, hf and
  // rstd_f at the slot's.
  struct HeadActs {
    bf16 *res_f, *hf;
    float* rstd_f;
  };
  std::vector<HeadActs> head_acts;
  // Shared work buffers. Under SP the *_full ones hold every row (gathered, or before a reduce-scatter);
  // otherwise they alias their local buffer.
  bf16 *tmp = nullptr, *tmp_full = nullptr, *hloc = nullptr, *res_f = nullptr, *hf = nullptr, *logits = nullptr;
  // The output layer's packed rows of hf, then (in place, chunk by chunk) their gradient. It is dgu's memory,
  // which only the layers' backward uses, when that is large enough (2 ffn >= d), else a buffer of its own.
  bf16* head_x = nullptr;
  bf16 *dres16 = nullptr, *dres16_full = nullptr, *dh = nullptr, *dh_full = nullptr, *stage_out = nullptr;
  bf16 *dact = nullptr, *dgu = nullptr, *datt = nullptr, *dqkv_rot = nullptr, *dqkv = nullptr;
  float *rstd_f = nullptr, *dres = nullptr, *dres_full = nullptr, *delta = nullptr, *partial = nullptr;
  // A stage before the last: where the next stage's gradient arrives, apart from dres (the gradient this stage
  // sends back): the interleaved schedule sends one chunk's and receives its next in the same group.
  float* dres_in = nullptr;
  float *ce_lse = nullptr, *ce_label = nullptr;  // vocabulary-parallel CE: [tp, chunk] lse, [chunk] label logits
  float* emb_partial = nullptr;
  double* loss_total = nullptr;  // device: the losses since take_loss()
  // zero_grad() does not clear the gradients the weight GEMMs write whole (qkv, proj, fc1, fc2, an untied output
  // layer): it marks them fresh, and the first GEMM into each afterwards overwrites (beta 0) instead of adding,
  // as PyTorch's set_to_none lets it do (the memset wrote 4 bytes a parameter: 8 GB a step of the 1.7B). The
  // host's flags follow enqueue order, which is the stream's. The other tensors (norms, the embedding's sparse
  // rows) are cleared: zero_runs, contiguous [offset, count) spans of the buffer.
  std::vector<char> grad_fresh, gemm_written;  // per tensor
  std::vector<std::pair<std::int64_t, std::int64_t>> zero_runs;
  // set_sparse_embedding_grad (cuda_sparse_embedding.cpp): a flag per row of the embedding's gradient, set where
  // its backward adds, cleared with the row by zero_grad (the embedding then leaves zero_runs); AdamW defers the
  // rows not flagged: emb_row_step is each row's last applied step, emb_history the steps' scalars (a ring of
  // emb_history_steps), and the rows are caught up when read: a forward's (catch_up_rows, through
  // emb_rows_needed), or all of them (settle_embedding) before the whole table is read or the ring would wrap.
  // emb_settled: the step every row has reached.
  std::uint8_t *emb_rows_written = nullptr, *emb_rows_needed = nullptr;
  int* emb_row_step = nullptr;
  AdamWStepScalars* emb_history = nullptr;
  int emb_history_steps = 0, emb_settled = 0;
  bool sparse_emb = false;
  bool rows_deferred() const { return sparse_emb && emb_settled < steps; }
  AdamWTensor embedding_rows() const;
  void catch_up_rows(const int* ids, int tokens);
  void settle_embedding();
  void embedding_rows_current();  // every row counts as updated to `steps` (values set, or the count moved)
  void record_adamw_step(const AdamWStepScalars& s);
  void build_zero_runs() {
    zero_runs.clear();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (gemm_written[i] || (sparse_emb && static_cast<int>(i) == emb)) continue;
      const std::int64_t first = offset[i], count = aligned_numel(static_cast<int>(i));
      if (!zero_runs.empty() && zero_runs.back().first + zero_runs.back().second == first)
        zero_runs.back().second += count;
      else
        zero_runs.emplace_back(first, count);
    }
  }
  float grad_beta(int p) {
    if (!grad_fresh[static_cast<std::size_t>(p)]) return 1.0f;
    grad_fresh[static_cast<std::size_t>(p)] = 0;
    return 0.0f;
  }
  // Clears what is still fresh (a GEMM that did not run since zero_grad), before anything reads the gradients
  // as a whole.
  void settle_grad(int p) {
    if (!grad_fresh[static_cast<std::size_t>(p)]) return;
    check_cuda(cudaMemsetAsync(grad + offset[p], 0, sizeof(float) * numel(p), stream), "memset");
    grad_fresh[static_cast<std::size_t>(p)] = 0;
  }
  void settle_grads() {
    for (std::size_t i = 0; i < grad_fresh.size(); ++i) settle_grad(static_cast<int>(i));
  }

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
  // Local widths (the whole model's when tp == 1).
  int ffn() const { return ffn_local; }
  int qdim() const { return heads * cfg.kv_channels; }
  int qkvdim() const { return (heads + 2 * groups) * cfg.kv_channels; }
  int vpad() const { return static_cast<int>(cfg.padded_vocab_size() / tp); }
  bool sharded() const { return shard.optimizer_shards > 1; }
  const bf16* W(int p) const { return w16 + offset[p]; }
  // The fp32 weights of norm tensor p as the kernels read them, whole on every rank (other tensors are read
  // as bf16, W(p)).
  const float* F(int p) const { return norms32 + norm_offset[p]; }
  float* G(int p) const { return grad + offset[p]; }
  // The whole model on this rank: no collectives inside a step, the profiler's phases make sense.
  bool whole() const { return tp == 1 && pre && post; }
  MicroInputs& uploaded(int k);  // micro-batch k's inputs (dlm::Error when not uploaded)
  int find(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? -1 : it->second;
  }

  // Forward graphs of the sampling path (run_graphed), per shape; they hold activation and workspace
  // pointers, so they go whenever those move. CudaOptions::cuda_graphs off or the profiler turns them off.
  // A graph's shape: the batch, and the columns whose rows reach the output layer.
  struct GraphShape {
    std::int64_t batch, seq;
    bool causal;
    std::int64_t first, end;
    bool operator==(const GraphShape&) const = default;
  };
  struct ForwardGraph {
    GraphShape shape;
    std::size_t workspace;
    cudaGraphExec_t exec;
  };
  std::vector<ForwardGraph> graphs;
  std::vector<ForwardGraph> seen;  // shapes run once eagerly (their per-shape plans are built)
  bool graphs_off = false;
  // The last layer's MLP on the loss rows only: after its attention block, only the rows the output layer reads
  // (in.head_rows, packed) go on through its second norm, fc1, SwiGLU, fc2 and the final norm; every other row's
  // output reaches nothing, and its gradient there is zero. The count of those rows (in.head_count), or 0 for
  // every row: the head packs its rows and one GPU holds the layer's whole width (recomputing, the rerun packs its
  // inputs into dgu, which must hold two rows of d per row: ffn >= hidden).
  int loss_rows_mlp(const MicroInputs& in) const {
    const bool on = post && layers > 0 && in.head_packed && in.head_count > 0 && tp == 1 &&
                    (!recompute || ffn() >= d());
    return on ? in.head_count : 0;
  }
  // Pinned copies of micro-batch k's uploads (not per activation shape: they outlive free_acts()).
  std::deque<UploadStaging> staging;
  UploadStaging& staging_for(int k) {
    while (static_cast<int>(staging.size()) <= k) staging.emplace_back();
    return staging[static_cast<std::size_t>(k)];
  }

  void clear_graphs() {
    for (auto& g : graphs) cudaGraphExecDestroy(g.exec);
    graphs.clear();
    seen.clear();
  }

  template <typename Enqueue>
  void run_graphed(const GraphShape& shape, Enqueue&& enqueue) {
    if (graphs_off || timer.enabled()) return enqueue();
    const std::size_t ws = attention->workspace_bytes();
    for (std::size_t i = 0; i < graphs.size(); ++i) {
      auto& g = graphs[i];
      if (!(g.shape == shape)) continue;
      if (g.workspace == ws) return check_cuda(cudaGraphLaunch(g.exec, stream), "graph launch");
      cudaGraphExecDestroy(g.exec);
      graphs.erase(graphs.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
    const auto same = [&](const ForwardGraph& g) { return g.shape == shape; };
    if (std::none_of(seen.begin(), seen.end(), same)) {
      seen.push_back({shape, ws, nullptr});
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
    graphs.push_back({shape, ws, exec});
    check_cuda(cudaGraphLaunch(exec, stream), "graph launch");
  }

  void free_acts() {
    clear_graphs();
    for (void* p : acts_owned) cudaFree(p);
    acts_owned.clear();
    act_bytes = 0;
    slots.clear();
    work = LayerActs{};
    inputs.clear();
    head_acts.clear();
    B = S = T = 0;  // the next upload allocates for its shape
  }

  // The shared buffers for micro-batches of batch x seq; slots and inputs come on demand.
  void ensure_acts(std::int64_t batch, std::int64_t seq) {
    if (batch == B && seq == S && T > 0) return;
    free_acts();
    B = batch, S = seq, T = batch * seq, Ts = sp ? T / tp : T;
    const std::int64_t nh = heads;
    chunk = std::min<std::int64_t>(T, std::max<std::int64_t>(64, static_cast<std::int64_t>(kLogitsBudget / (2 * vpad())) / 64 * 64));
    tmp = act<bf16>(Ts * d()), res_f = act<bf16>(Ts * d()), dres16 = act<bf16>(Ts * d()), dh = act<bf16>(Ts * d());
    hf = act<bf16>(T * d()), logits = act<bf16>(chunk * vpad()), dact = act<bf16>(T * ffn());
    tmp_full = sp ? act<bf16>(T * d()) : tmp, hloc = sp ? act<bf16>(Ts * d()) : nullptr;
    dres16_full = sp ? act<bf16>(T * d()) : dres16, dh_full = sp ? act<bf16>(T * d()) : dh;
    stage_out = post ? nullptr : act<bf16>(Ts * d()), dres_in = post ? nullptr : act<float>(Ts * d());
    dgu = act<bf16>(T * 2 * ffn()), datt = act<bf16>(T * qdim()), dqkv_rot = act<bf16>(T * qkvdim());
    dqkv = act<bf16>(T * qkvdim());
    head_x = !post ? nullptr : 2 * ffn() >= d() ? dgu : act<bf16>(T * d());
    rstd_f = act<float>(Ts), dres = act<float>(Ts * d()), delta = act<float>(T * nh);
    dres_full = sp && pre ? act<float>(T * d()) : dres;
    if (tp > 1) ce_lse = act<float>(tp * chunk), ce_label = act<float>(chunk);
    QkvShape qs{static_cast<int>(T), heads, groups, cfg.kv_channels, cfg.qk_layernorm, 0};
    partial = act<float>(std::max(rmsnorm_partial_floats(static_cast<int>(T), d()), qk_norm_partial_floats(qs)));
    emb_partial = act<float>(embedding_plan_slots(static_cast<int>(T)) * d());
    loss_total = act<double>(1);
    check_cuda(cudaMemsetAsync(loss_total, 0, sizeof(double), stream), "memset");
  }

  // One layer's activations for the current shape, its input (res1) when `input`.
  LayerActs layer_acts(bool input) {
    const std::int64_t norms = heads + groups;
    LayerActs a{};
    if (input) a.res1 = act<bf16>(Ts * d());
    a.h1 = act<bf16>(T * d()), a.qkv_raw = act<bf16>(T * qkvdim());
    a.qkv_rot = act<bf16>(T * qkvdim()), a.att = act<bf16>(T * qdim()), a.res2 = act<bf16>(Ts * d());
    a.h2 = act<bf16>(T * d()), a.gu = act<bf16>(T * 2 * ffn()), a.act = act<bf16>(T * ffn());
    a.rstd1 = act<float>(Ts), a.qk_rstd = act<float>(T * norms), a.lse = act<float>(T * heads), a.rstd2 = act<float>(Ts);
    return a;
  }
  std::vector<LayerActs>& slot_acts(int s) {
    if (s < 0) fail(fmt::format("CudaModel: activation slot {}", s));
    if (recompute && !work.h1) work = layer_acts(false);
    while (static_cast<int>(slots.size()) <= s) {
      auto& la = slots.emplace_back(static_cast<std::size_t>(layers));
      for (auto& a : la) {
        if (recompute) a = work, a.res1 = act<bf16>(Ts * d());
        else a = layer_acts(true);
      }
    }
    return slots[static_cast<std::size_t>(s)];
  }

  void use_head(int slot) {
    if (slot < 0) fail(fmt::format("CudaModel: activation slot {}", slot));
    if (head_acts.empty()) head_acts.push_back({res_f, hf, rstd_f});  // slot 0: the shared buffers
    while (static_cast<int>(head_acts.size()) <= slot)
      head_acts.push_back({act<bf16>(Ts * d()), act<bf16>(T * d()), act<float>(Ts)});
    const HeadActs& h = head_acts[static_cast<std::size_t>(slot)];
    res_f = h.res_f, hf = h.hf, rstd_f = h.rstd_f;
  }

  MicroInputs& input_set(int k) {
    if (k < 0) fail(fmt::format("CudaModel: micro-batch {}", k));
    while (static_cast<int>(inputs.size()) <= k) {
      auto& in = inputs.emplace_back();
      in.ids = act<int>(T), in.labels = act<int>(T), in.pos = act<int>(T), in.order = act<int>(T);
      in.head_rows = act<int>(T), in.head_slot = act<int>(T);
      in.weights = act<float>(T), in.loss_rows = act<float>(T);
      in.segments = act<EmbeddingSegment>(embedding_plan_segments(static_cast<int>(T)));
      in.combine = act<EmbeddingCombine>(embedding_plan_slots(static_cast<int>(T)));
    }
    return inputs[static_cast<std::size_t>(k)];
  }

  // Tensor p's whole (local) fp32 values in device memory become its weights: the bf16 upper halves of all of
  // them, the lower halves of the part in the optimizer range and, for a norm, its fp32 copies.
  void set_weights(int p, const float* values) {
    const MomentPart part = moment_part(p);
    if (part.numel < numel(p)) split_master(values, w16 + offset[p], nullptr, numel(p), stream);
    if (part.numel > 0)
      split_master(values + part.in_tensor, w16 + offset[p] + part.in_tensor, w_lo + part.in_moments, part.numel,
                   stream);
    check_cuda(cudaGetLastError(), "split_master");
    if (norm_offset[p] < 0) return;
    check_cuda(cudaMemcpyAsync(norms32 + norm_offset[p], values, sizeof(float) * numel(p), cudaMemcpyDeviceToDevice,
                               stream),
               "norm weights");
    if (norms_owned != norms32 && part.numel > 0)
      check_cuda(cudaMemcpyAsync(norms_owned + norm_offset[p] + part.in_tensor, values + part.in_tensor,
                                 sizeof(float) * part.numel, cudaMemcpyDeviceToDevice, stream),
                 "norm weights");
  }
  // Tensor p's master weights (join_master_bits of the halves) in the optimizer range, zeros outside it (with
  // shards the ranks' exports sum to the whole tensor).
  std::vector<float> export_master(int p) const;
  std::int64_t numel(int p) const {
    std::int64_t n = 1;
    for (auto s : specs[static_cast<std::size_t>(p)].local_shape) n *= s;
    return n;
  }
  // Tensor p's room in a flat buffer: its elements rounded up to kAlign.
  std::int64_t aligned_numel(int p) const { return (numel(p) + kAlign - 1) / kAlign * kAlign; }
  int find_or_fail(std::string_view name) const {
    const int p = find(std::string(name));
    if (p < 0) fail(fmt::format("CudaModel: no parameter '{}'", name));
    return p;
  }
  // Device collectives of the tensor group on the model's stream (no-ops when tp == 1). Under SP, gather
  // takes the rank's rows to every row and scatter_sum sums every row's partials back to the rank's rows;
  // without SP the rows are whole: gather is nothing and scatter_sum an all-reduce (full == local then).
  void gather(const bf16* local, bf16* full) {
    if (sp) shard.tensor->all_gather(local, full, static_cast<std::size_t>(Ts * d()), DeviceElement::kBF16, stream);
  }
  void scatter_sum(bf16* full, bf16* local) {
    if (tp == 1) return;
    if (sp) shard.tensor->reduce_scatter(full, local, static_cast<std::size_t>(Ts * d()), DeviceElement::kBF16, stream);
    else shard.tensor->all_reduce(full, static_cast<std::size_t>(T * d()), DeviceElement::kBF16, stream);
  }

  // The part of tensor p inside the optimizer's range (all of it without shards), as (element of p, element
  // of the moment buffers, count); count 0 when the range misses it.
  struct MomentPart {
    std::int64_t in_tensor = 0, in_moments = 0, numel = 0;
  };
  MomentPart moment_part(int p) const {
    const std::int64_t lo = opt_first, hi = opt_first + opt_numel;
    const std::int64_t a = std::max(offset[p], lo), b = std::min(offset[p] + numel(p), hi);
    if (a >= b) return {};
    return {a - offset[p], a - lo, b - a};
  }
  // The tensor list the multi-tensor kernels walk: each tensor's part inside the optimizer's range, in model
  // order, tensors the range misses left out; weight decay is per call (the options may change).
  std::vector<AdamWTensor> adam_list(double weight_decay) const {
    std::vector<AdamWTensor> list;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const int p = static_cast<int>(i);
      const MomentPart part = moment_part(p);
      if (part.numel == 0) continue;
      float* f32 = norm_offset[i] >= 0 ? norms_owned + norm_offset[i] + part.in_tensor : nullptr;
      list.push_back({w16 + offset[i] + part.in_tensor, w_lo + part.in_moments, f32, G(p) + part.in_tensor,
                      m + part.in_moments, v + part.in_moments, part.numel,
                      specs[i].is_norm ? 0.0f : static_cast<float>(weight_decay)});
      if (sparse_emb && p == emb)
        list.back().rows_written = emb_rows_written, list.back().row_len = d(), list.back().row_step = emb_row_step;
    }
    return list;
  }
  // Tensor p's values from a buffer of the optimizer range (m or v), zeros outside the range (with
  // shards the ranks' exports sum to the whole tensor).
  std::vector<float> export_part(int p, const float* range_buffer) const {
    std::vector<float> out(static_cast<std::size_t>(numel(p)), 0.0f);
    const MomentPart part = moment_part(p);
    if (part.numel > 0)
      check_cuda(cudaMemcpyAsync(out.data() + part.in_tensor, range_buffer + part.in_moments,
                                 static_cast<std::size_t>(part.numel) * 4, cudaMemcpyDeviceToHost, stream),
                 "export");
    check_cuda(cudaStreamSynchronize(stream), "export");
    return out;
  }
  void upload_adam_list(double weight_decay) {
    const std::vector<AdamWTensor> list = adam_list(weight_decay);
    check_cuda(cudaMemcpyAsync(adam_dev, list.data(), list.size() * sizeof(AdamWTensor), cudaMemcpyHostToDevice, stream),
               "adamw list");
  }
};

// cuda_model_stage.cpp: micro-batch k's columns to the device, as much as its use needs (training: the
// labels, weights and the embedding backward's grouping; loss: labels and weights; sampling: ids and
// positions), and the forward of one micro-batch's layers (the samplers' forward as well).
enum class Upload { kTraining, kLoss, kSampling };
void upload_micro_batch(CudaModel::Impl& I, int k, const CudaBatch& batch, Upload use);
void enqueue_forward(CudaModel::Impl& I, const MicroInputs& in, std::vector<LayerActs>& la);

inline std::vector<float> download(const float* src, std::int64_t n, cudaStream_t stream) {
  std::vector<float> out(static_cast<std::size_t>(n));
  check_cuda(cudaMemcpyAsync(out.data(), src, out.size() * 4, cudaMemcpyDeviceToHost, stream), "export");
  check_cuda(cudaStreamSynchronize(stream), "export");
  return out;
}

}  // namespace dlm::train
