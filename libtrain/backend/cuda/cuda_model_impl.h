// CudaModel's state, shared by the files that implement it, grouped by what owns it:
//   params     ParameterStore (parameter_store.h): weights, gradients, AdamW state, the tensor list
//   fresh      GradientFreshness (grad_freshness.h): which gradients the next GEMM overwrites
//   deferred   DeferredEmbeddingRows (deferred_embedding.h): the sparse embedding's row flags and AdamW ring
//   acts       ActivationBuffers (activations.h): the work buffers, per-slot layer activations, head inputs
//   inputs     MicroBatchInputs (micro_inputs.h): the micro-batches' columns and their pinned staging
//   graphs     ForwardGraphCache (forward_graphs.h): the samplers' captured forwards
//   kv         KvStores (kv_store.h): the samplers' block KV cache
//   state_copy StateCopy (state_copy.h): the checkpoint state's pinned host copy, and the copies in flight
//   moe        MoeBuffers (moe_layer.h): the MoE layers' routing, expert activations and work buffers
//   dispatch   ExpertDispatch (moe_dispatch.h): under expert parallelism, the MoE layers' exchanged rows
// and, here, what the rank runs (its widths, layers and ends), the stream, the GEMM and attention engines.
// Files: cuda_model.cpp (construction, parameters by name), cuda_model_stage.cpp (a step's stages and their
// collectives), micro_inputs.cpp (uploads), cuda_model_optimizer.cpp (the norm, AdamW, the optimizer state's
// import/export), cuda_sparse_embedding.cpp (the deferred rows), cuda_model_sampling.cpp (the samplers' forward),
// cuda_model_moe.cpp (the MoE layers' MLP), cuda_moe_dispatch.cpp (its experts under expert parallelism).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "activations.h"
#include "attention_cudnn.h"
#include "deferred_embedding.h"
#include "device_arena.h"
#include "dlm/train/cuda_memory_plan.h"
#include "dlm/train/cuda_model.h"
#include "forward_graphs.h"
#include "fp8_linear.h"
#include "gemm.h"
#include "grad_freshness.h"
#include "grouped_gemm.h"
#include "kernels.h"
#include "kv_store.h"
#include "micro_inputs.h"
#include "moe_dispatch.h"
#include "moe_layer.h"
#include "parameter_store.h"
#include "phase_timer.h"
#include "side_stream.h"
#include "state_copy.h"
#include "swiglu_gemm.h"

namespace dlm::train {

using namespace dlm::train::cuda;

namespace cuda_detail {
// The parameters of one layer: indices into ParameterStore's tensors. An MoE layer has a router and experts, and
// fc1 and fc2 are its shared expert's (-1 without one); a dense layer has fc1 and fc2 (the others -1).
struct LayerParams {
  int ln1, qkv, qn, kn, proj, ln2, fc1, fc2;
  int router = -1, experts_fc1 = -1, experts_fc2 = -1;
  bool moe() const { return router >= 0; }
};
}  // namespace cuda_detail

using namespace cuda_detail;

struct CudaModel::Impl {
  explicit Impl(const CudaOptions& o) : options(o), timer(o.profile), graphs(!o.cuda_graphs) {}
  CudaOptions options;
  PhaseTimer timer;
  ckpt::ModelConfig cfg;
  CudaShard shard;
  // The part of the model this rank runs: tensor-parallel size and local widths, its layers, its ends.
  int tp = 1, heads = 0, groups = 0, ffn_local = 0, first_layer = 0, layers = 0;
  std::int64_t vocab_first = 0, vocab_local = 0;  // padded-vocabulary rows [first, first + vpad()) held, real ones
  bool sp = false, pre = true, post = true;
  std::vector<LayerParams> lp;  // this rank's layers
  int emb = -1, lnf = -1, out = -1;
  cudaStream_t stream = nullptr;
  bool owns_stream = true;  // false when CudaShard::stream was given
  std::function<void(int)> layer_hook;  // set_backward_layer_hook
  std::unique_ptr<Gemm> gemm;
  std::unique_ptr<SwigluBackwardGemm> swiglu_gemm;  // the fc2 data GEMM with SwiGLU's backward fused
  std::unique_ptr<Attention> attention;
  std::unique_ptr<Fp8Linears> fp8;  // CudaOptions::fp8 enabled: the FP8 linear layers (fp8_linear.h)
  // CudaOptions::fp8_sampling: the samplers' FP8 linear layers (forward-only; its input buffer sized with the
  // activations, ensure_acts).
  std::unique_ptr<Fp8Linears> sampling_fp8;
  std::unique_ptr<GroupedGemm> grouped;  // the MoE experts' GEMMs (null without MoE layers)
  // The MoE layers' shared expert runs on this stream with its own GEMMs (null without a shared expert).
  std::unique_ptr<SideStream> moe_side;
  std::unique_ptr<Gemm> moe_side_gemm;
  float *rope_cos = nullptr, *rope_sin = nullptr;  // [max_position_embeddings + 1, kv_channels / 2]
  DeviceArena tables;                              // the RoPE tables'
  ParameterStore params;
  GradientFreshness fresh;
  DeferredEmbeddingRows deferred;
  ActivationBuffers acts;
  MicroBatchInputs inputs;
  ForwardGraphCache graphs;
  KvStores kv;
  StateCopy state_copy;
  MoeBuffers moe;
  ExpertDispatch dispatch;

  int d() const { return cfg.hidden_size; }
  // Local widths (the whole model's when tp == 1).
  int ffn() const { return ffn_local; }
  int qdim() const { return heads * cfg.kv_channels; }
  int qkvdim() const { return (heads + 2 * groups) * cfg.kv_channels; }
  int vpad() const { return static_cast<int>(cfg.padded_vocab_size() / tp); }
  // The whole model on this rank: no collectives inside a step, the profiler's phases make sense.
  bool whole() const { return tp == 1 && pre && post; }

  // The activations (and input sets) for micro-batches of batch x seq; slots and inputs come on demand.
  void ensure_acts(std::int64_t batch, std::int64_t seq);
  void free_acts() {
    graphs.clear();  // they hold activation pointers
    acts.release();
    moe.release();
    dispatch.release();
    inputs.release();
  }
  std::vector<LayerActs>& slot_acts(int s) {
    auto& la = acts.slot(s, layers);
    for (int l = 0; l < layers; ++l)
      if (lp[static_cast<std::size_t>(l)].moe() && !la[static_cast<std::size_t>(l)].moe)
        la[static_cast<std::size_t>(l)].moe = moe.layer(s, l);
    return la;
  }
  MicroInputs& input_set(int k) { return inputs.set(k, acts.layout.inputs); }

  // The gradients' freshness (grad_freshness.h) on this model's buffers and stream.
  float grad_beta(int p) { return fresh.beta(p); }
  void settle_grad(int p) { fresh.settle(p, params, stream); }
  void settle_grads() { fresh.settle_all(params, stream); }
  void build_zero_runs() { fresh.build_zero_runs(params, deferred.on ? emb : -1); }
  // The tensor list to the device, the sparse embedding's rows flagged in it (adamw.cu skips or defers the rest).
  void upload_adam_list(double weight_decay);
  // The bf16 weights changed (init, import, the optimizer): the FP8 copies are cast again before the next forward.
  void weights_changed() {
    if (fp8) fp8->mark_weights_changed();
    if (sampling_fp8) sampling_fp8->mark_weights_changed();
  }

  // Before anything enqueued writes the weights or the moments: after a checkpoint's copies of them (state_copy.h).
  void before_state_write() { state_copy.order_writes(stream); }
  // The deferred embedding rows (cuda_sparse_embedding.cpp).
  bool rows_deferred() const { return deferred.deferred(params.steps); }
  AdamWTensor embedding_rows() const;
  void catch_up_rows(const int* ids, int tokens);
  void settle_embedding();
  void embedding_rows_current();  // every row counts as updated to `steps` (values set, or the count moved)
  void record_adamw_step(const AdamWStepScalars& s);

  // The last layer's MLP on the loss rows only: after its attention block, only the rows the output layer reads
  // (in.head_rows, packed) go on through its second norm, fc1, SwiGLU, fc2 and the final norm; every other row's
  // output reaches nothing, and its gradient there is zero. The count of those rows (in.head_count), or 0 for
  // every row: the head packs its rows and one GPU holds the layer's whole width (recomputing, the rerun packs its
  // inputs into dgu, which must hold two rows of d per row: ffn >= hidden).
  int loss_rows_mlp(const MicroInputs& in) const {
    // An MoE last layer routes every row (its router losses are over all of them).
    const bool on = post && layers > 0 && in.head_packed && in.head_count > 0 && tp == 1 &&
                    (!acts.recompute || ffn() >= d()) && !lp.back().moe();
    return on ? in.head_count : 0;
  }
  // Device collectives of the tensor group on the model's stream (no-ops when tp == 1). Under SP, gather
  // takes the rank's rows to every row and scatter_sum sums every row's partials back to the rank's rows;
  // without SP the rows are whole: gather is nothing and scatter_sum an all-reduce (full == local then).
  void gather(const bf16* local, bf16* full) {
    if (sp)
      shard.tensor->all_gather(local, full, static_cast<std::size_t>(acts.Ts * d()), DeviceElement::kBF16, stream);
  }
  void scatter_sum(bf16* full, bf16* local) {
    if (tp == 1) return;
    if (sp)
      shard.tensor->reduce_scatter(full, local, static_cast<std::size_t>(acts.Ts * d()), DeviceElement::kBF16, stream);
    else shard.tensor->all_reduce(full, static_cast<std::size_t>(acts.T * d()), DeviceElement::kBF16, stream);
  }
};

// micro_inputs.cpp: micro-batch k's columns to the device, as much as its use needs (training: the labels,
// weights and the embedding backward's grouping; loss: labels and weights; sampling: ids and positions).
// kWindow: a sampling window's columns (CudaModel's KvCacheUse) into the activations' shape as it is, which must
// hold at least as many rows.
enum class Upload { kTraining, kLoss, kSampling, kWindow };
void upload_micro_batch(CudaModel::Impl& I, int k, const CudaBatch& batch, Upload use);
// cuda_model_stage.cpp: the forward of one micro-batch's layers (the samplers' forward as well).
// With `kv` (the samplers' block KV cache, kv_store.h): a storing forward keeps each layer's K and V in kv->store; a
// window forward runs kv->rows() rows (the activations' first rows) and attends over the store.
// `fp8_slot`: the linear layers in FP8 where CudaOptions::fp8 chooses, their input scales kept for the backward of
// activation slot fp8_slot (the training stages); -1: the samplers' forward, in FP8 under CudaOptions::fp8_sampling
// (whose weights the caller has cast first: Fp8Linears::cast_weights), else bf16.
void enqueue_forward(CudaModel::Impl& I, const MicroInputs& in, std::vector<LayerActs>& la, const KvPass* kv = nullptr,
                     int fp8_slot = -1);
// cuda_model_moe.cpp: layer l's MoE MLP from A.h2 (`tokens` rows) into the shared tmp (under `recompute`, the
// backward's rerun, only up to the experts' SwiGLU), and its backward from dres16_full into dh.
void enqueue_moe_forward(CudaModel::Impl& I, LayerActs& A, int l, int tokens, bool recompute);
void enqueue_moe_backward(CudaModel::Impl& I, const MicroInputs& in, LayerActs& A, int l);
// cuda_model_moe.cpp: the experts' grouped GEMMs over `rows` (moe_layer.h), both paths': plan_expert_gemms fills
// every MoeGemm's per-group arrays on the device from rows.offsets (once per layer's forward, for its backward too);
// run_expert_gemm enqueues one (a weight gradient's overwrites after zero_grad, its empty groups then cleared).
void plan_expert_gemms(CudaModel::Impl& I, const LayerParams& P, const ExpertRows& rows);
void run_expert_gemm(CudaModel::Impl& I, const LayerParams& P, const ExpertRows& rows, MoeGemm g);
// cuda_moe_dispatch.cpp: under expert parallelism, layer l's routed rows (sorted, A.moe) through the EP group's
// experts: their outputs into the MoE work buffers' ys, in xs's order; the backward's d xs into ys and the routing
// weights' gradients into dw, as the local experts leave them.
void enqueue_expert_parallel_forward(CudaModel::Impl& I, LayerActs& A, int l, int tokens);
void enqueue_expert_parallel_backward(CudaModel::Impl& I, LayerActs& A, int l);

inline std::vector<float> download(const float* src, std::int64_t n, cudaStream_t stream) {
  std::vector<float> out(static_cast<std::size_t>(n));
  check_cuda(cudaMemcpyAsync(out.data(), src, out.size() * 4, cudaMemcpyDeviceToHost, stream), "export");
  check_cuda(cudaStreamSynchronize(stream), "export");
  return out;
}

}  // namespace dlm::train
