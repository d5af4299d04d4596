// CudaModel: the transformer of model.h trained on one NVIDIA GPU, bf16 activations and weights with fp32
// master weights (held as the bf16 weights plus a 16-bit remainder each: backend/cuda/master_split.h),
// gradients and AdamW moments, fused kernels (libtrain/backend/cuda/kernels.h) and cuBLASLt GEMMs. It
// computes what Model computes on the CPU backend (the parity test holds it to that),
// but as whole training steps rather than through the per-op Backend seam, because the seam's fp32
// tensors, separate q/k/v and host optimizer would cost the GPU its speed (docs/cuda.md says which seam
// changes would let it sit behind Backend).
//
// Parameters are named and shaped as model_tensors(config) says; host import/export is fp32.
// A step:  loss = forward_backward(batch) (adds into the gradients) ; adamw_step(...) ; zero_grad().
//
// Model parallelism (CudaShard; docs/parallelism.md): one rank's part of a model in Megatron's layout, the
// slices of libckpt's rank_shards() (the CPU backend's and the checkpoints' rules). Tensor parallelism puts
// the collectives where model.h says, enqueued on the model's stream through a DeviceGroup (bf16 for
// activations, as Megatron); sequence parallelism keeps 1/TP of the token rows in the residual stream and
// the norms. Pipeline stages run through the stage calls below (device_pipeline.h schedules them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/sharding.h"
#include "dlm/train/cuda_options.h"
#include "dlm/train/device_group.h"
#include "dlm/train/optimizer.h"

namespace dlm::train {

// One micro-batch on the host, [batch, seq] row-major; weights as the objective makes them (objective.h).
struct CudaBatch {
  std::int64_t batch = 0, seq = 0;
  bool causal = false;
  std::span<const std::int32_t> ids, labels, positions;
  std::span<const float> weights;
  // The MoE router losses' weight in the backward (objective.h's ModelBatch::router_loss_weight; Megatron's
  // MoEAuxLossAutoScaler scale, 1 / micro-batches).
  double router_loss_weight = 1.0;
};

// This rank's part of the model: its tensor rank and pipeline stage under `layout` (with virtual stages, one
// CudaModel per chunk: layout.pp counts every chunk's stage, chunk v of pipeline rank r is stage v * PP + r),
// and the tensor group (layout.tp members; null when tp == 1). The default is the whole model.
// The distributed optimizer (optimizer_shards > 1, one per data-parallel rank; Megatron's): the flat parameter
// buffer is cut into that many equal ranges; this rank holds the master weights and AdamW moments of
// range optimizer_rank only, and apply_adamw() updates that range (its caller reduce-scatters the gradients
// into it first, over optimizer_range(), and calls share_updated_weights() after). The bf16 weights stay
// whole on every rank, and so do fp32 copies of the norm weights, which the kernels read in fp32.
struct CudaShard {
  ckpt::ParallelLayout layout{};
  int tensor_rank = 0, stage = 0;
  bool sequence_parallel = false;
  DeviceGroup* tensor = nullptr;
  int optimizer_shards = 1, optimizer_rank = 0;
  // Expert parallelism (layout.ep > 1, MoE layers): this rank's place in the expert-parallel group (layout.ep
  // members), whose all-to-alls carry the routed rows to their experts and back (cuda_moe_dispatch.h); the rank
  // holds experts [expert_rank E / ep, (expert_rank + 1) E / ep) of each MoE layer.
  int expert_rank = 0;
  DeviceGroup* expert = nullptr;
  // A cudaStream_t to run on instead of the model's own (not owned): an interleaved rank's chunks share one,
  // so a transfer enqueued for one chunk is ordered with every other chunk's kernels.
  void* stream = nullptr;
};

// Columns [first, end) of every sequence of a batch; end < 0 means the sequence's end.
struct ColumnWindow {
  std::int64_t first = 0, end = -1;
};

// A sampling forward's use of the block KV cache (sampler.h's CachedLogitsModel; whole model, bidirectional).
// `store` names one of the caches the model keeps (a caller running padding groups apart keeps one per group).
//   kStore: the whole forward as without a cache, and every layer's K (after QK-norm and RoPE) and V of every token
//     kept in the store, [batch, seq, groups, head_dim] bf16, replacing what it held (allocated again for a shape
//     other than the one it holds);
//   kWindow: only the columns [columns.first, columns.end) of each row run through the layers, from the ids there;
//     their queries attend to their own keys and values (computed now) inside the window and to the store's at
//     every other column, unmasked; the store is left as it was (the CPU Model's forward_window). The ids and
//     positions are the whole batch's ([batch, seq], the store's shape); forward_logits returns the window's rows
//     [batch * (end - first), vocab], greedy_tokens takes a greedy window inside the columns.
// dlm::Error for a causal forward, a window without a stored shape to match, or columns outside the sequence.
struct KvCacheUse {
  enum class Mode { kNone, kStore, kWindow } mode = Mode::kNone;
  int store = 0;
  ColumnWindow columns{};  // kWindow
};

class CudaModel {
 public:
  // Allocates parameters and optimizer state on the current device; dlm::Error without one, for a layout
  // libckpt's sharding rules refuse, or for options.deferred_embedding_steps < 1.
  explicit CudaModel(ckpt::ModelConfig config, CudaShard shard = {}, CudaOptions options = {});
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  static bool device_available();
  const ckpt::ModelConfig& config() const;
  const CudaShard& shard() const;
  const CudaOptions& options() const;
  // This rank's tensors in model order: global names, local shapes, where they sit in the global tensors.
  const std::vector<ckpt::TensorShard>& tensors() const;
  bool pre_process() const;   // holds the embedding (the first stage)
  bool post_process() const;  // holds the final norm, the output layer and the loss (the last stage)

  // Model::init's values for the same seed (N(0, init_method_std^2) matrices from the counter stream, norms 1),
  // drawn on the device; a shard gets its slice of the whole model's values.
  void init(std::uint64_t seed);
  // Import and export are of this rank's (local) tensors, whole. With optimizer shards an import keeps the
  // range's part of the master weights (the bf16 weights from all of it), and an export reads 0 outside the
  // range (the shards' exports sum to the whole tensor).
  void import_parameter(std::string_view name, std::span<const float> values);
  std::vector<float> export_parameter(std::string_view name) const;
  std::vector<float> export_gradient(std::string_view name) const;
  // For checkpoints: export_parameter of every tensor in tensors() order, the same values, through a pinned
  // host buffer allocated at the first call and kept (one device->host copy a buffer, not one a tensor) until
  // release_host_buffers() (a load, which reads the weights once, calls it: runs that never save pin nothing).
  std::vector<std::vector<float>> export_parameters();
  void release_host_buffers();
  // For checkpoints without optimizer shards (state_copy.h): begin_state_copy() enqueues copies of the fp32 master
  // weights and, with `moments`, AdamW's moments into pinned host memory as they stand after the work enqueued so
  // far, and returns; the next write of that state on the device waits for them there. finish_state_copy() blocks
  // (any thread) until they landed; the copied_* views of tensor p (tensors() order) then hold them until the next
  // begin_state_copy(). reserve_state_copy() allocates the host memory (12 bytes a parameter) beforehand.
  void reserve_state_copy();
  void begin_state_copy(bool moments);
  void finish_state_copy() const;
  std::span<const float> copied_parameter(int p) const;
  std::span<const float> copied_exp_avg(int p) const;
  std::span<const float> copied_exp_avg_sq(int p) const;
  std::int64_t parameter_count() const;

  // Forward and backward of sum_i weights_i * CE_i over the real vocabulary; gradients accumulate (+=).
  // Returns the loss (double sum of the per-token terms).
  double forward_backward(const CudaBatch& batch);
  // Forward only: fp32 logits [batch * seq, vocab_size] (bf16 values), for sampling and parity checks.
  // positions may be empty (0..seq-1 per row).
  std::vector<float> forward_logits(std::int64_t batch, std::int64_t seq, bool causal,
                                    std::span<const std::int32_t> ids, std::span<const std::int32_t> positions,
                                    const KvCacheUse& kv = {});
  // Forward only, then per position of `window` the most likely token and its probability (fp32 softmax
  // over the real vocabulary): the diffusion samplers' greedy x0 and confidence, with no logits leaving the
  // device. tokens and confidence are [batch, seq]; columns outside the window read 0 (their rows skip the
  // output layer).
  void greedy_tokens(std::int64_t batch, std::int64_t seq, bool causal, std::span<const std::int32_t> ids,
                     std::span<const std::int32_t> positions, std::vector<std::int32_t>& tokens,
                     std::vector<float>& confidence, ColumnWindow window = {}, const KvCacheUse& kv = {});
  // Frees the KV stores (KvCacheUse) whose names are not in `keep`.
  void release_kv_stores(std::span<const int> keep);
  // The same loss, forward only (no gradient).
  double forward_loss(const CudaBatch& batch);
  // The gradients read as zero from here on. Those the weight GEMMs write whole are not cleared but overwritten
  // by their next GEMM (no memset of 4 bytes a parameter); the others (norms, the sparse embedding's flagged
  // rows, a tied embedding) are cleared.
  void zero_grad();
  // Global-norm clipping (max_norm <= 0: none) then AdamW at lr, all on the device; returns the norm.
  double adamw_step(const AdamWOptions& options, double lr, double max_norm);
  // adamw_step in two halves, so a caller can look at the norm before it decides to update: grad_norm()
  // takes the sum of squares on the device (and returns the norm), apply_adamw() clips by that sum.
  double grad_norm();
  void apply_adamw(const AdamWOptions& options, double lr, double max_norm);
  // Model parallelism: grad_sumsq() is this rank's share of the squared norm (the tensors it saves: a
  // replicated norm counts on tensor rank 0 only, the last stage's tied embedding not at all); once the
  // caller has summed the shares over the replica, set_grad_sumsq() makes that the sum apply_adamw() clips by.
  double grad_sumsq();
  void set_grad_sumsq(double sumsq);
  // --log-num-zeros-in-grad: the exact zeros among the gradients grad_sumsq() counts (this rank's share: the
  // tensors it saves, in its optimizer range), as they stand (unclipped: apply_adamw() clips on the fly).
  std::int64_t grad_zeros();

  // Full activation recomputation (Megatron's --recompute-granularity full, a checkpoint per layer): each layer
  // keeps only its input and the backward runs the layer's forward again just before the layer's backward,
  // one layer's activations shared by all (cuda_memory_plan.h counts them). The gradients are the same bits as
  // without it; the step does one more forward of the layers (up to SwiGLU). A change frees the activations:
  // call it between steps.
  void set_recompute_layers(bool full);
  bool recompute_layers() const;

  // The untied embedding's gradient as the rows the step's tokens wrote: the backward flags each row it adds into, and
  // the norm and zero_grad read or clear only the flagged rows, not the whole [vocab, hidden] table (1.2 GB of fp32 on
  // the 1.7B Qwen3 shape). AdamW updates only those rows too: another row's update (g = 0) is deferred and replayed,
  // step by step with the same arithmetic, when a forward reads the row or anything reads the whole table (exports,
  // imports, sampling), so every weight, moment and loss is the same bits as updating every row every step
  // (cuda_sparse_embedding.cpp). Only for a caller that writes no gradient itself: a data-parallel all-reduce of the
  // buffer fills rows another replica's tokens wrote, unflagged here, so the trainer turns it on for one replica only.
  // dlm::Error for a tied embedding, an optimizer shard or a rank without the embedding. Call it between steps.
  void set_sparse_embedding_grad(bool on);
  bool sparse_embedding_grad() const;

  // ---- pipeline stages: forward_backward() of one micro-batch is these calls in a row ----
  // Micro-batch k's columns on the device, before its step's first transfer (the host never waits on a
  // stream that holds collectives). Every micro-batch of a step has the same shape.
  void upload_inputs(int k, const CudaBatch& batch);
  // Activations for `count` micro-batches in flight, allocated now (not between a step's collectives).
  void reserve_slots(int count);
  // The hidden-state rows this rank passes between stages: batch * seq, or 1/TP of them under SP.
  std::int64_t stage_rows() const;
  // Forward of micro-batch k with its activations in `slot` (one per micro-batch in flight). A stage
  // without the embedding reads its input from stage_input(slot) (bf16 [stage_rows, hidden]); one without
  // the head leaves its output in stage_output() (bf16, until the next forward_stage). With training off
  // the last stage adds the loss of k (forward only).
  void* stage_input(int slot);
  void forward_stage(int k, int slot, bool training);
  const void* stage_output() const;
  // Backward of micro-batch k (slot as its forward): the last stage computes the head and the loss from
  // the forward just run on that slot; any other stage first receives d output into stage_output_grad()
  // (fp32 [stage_rows, hidden]). A stage without the embedding leaves d input in stage_input_grad()
  // (fp32, until the next backward_stage).
  float* stage_output_grad();
  void backward_stage(int k, int slot);
  const float* stage_input_grad() const;
  // The losses added since the last call (a host copy: call it once the groups have completed).
  double take_loss();
  // AdamW's state by parameter name (fp32, model_tensors' shape) and its step count, for checkpoints. With
  // optimizer shards, the elements outside this rank's range read 0 (the shards' exports sum to the whole)
  // and an import keeps the elements inside it.
  std::vector<float> export_exp_avg(std::string_view name) const;
  std::vector<float> export_exp_avg_sq(std::string_view name) const;
  // export_exp_avg and export_exp_avg_sq of every tensor in tensors() order, as export_parameters().
  void export_moments(std::vector<std::vector<float>>& exp_avg, std::vector<std::vector<float>>& exp_avg_sq);
  void import_moments(std::string_view name, std::span<const float> exp_avg, std::span<const float> exp_avg_sq);
  std::int64_t optimizer_steps() const;
  void set_optimizer_steps(std::int64_t steps);
  // Device memory for collectives (NCCL): the fp32 gradients, one contiguous buffer of every parameter in
  // model_tensors order (gaps between tensors, and the padding that makes the buffer a multiple of the
  // optimizer shards, hold zeros), per tensor too; the master weights, without optimizer shards only (dlm::Error
  // with them): 4 bytes a parameter as a span of as many floats, which are not fp32 values but the weights'
  // bf16 upper halves followed by their 16-bit lower halves (master_split.h), for a bitwise copy such as a
  // broadcast; and the stream every kernel of the model runs on (a cudaStream_t).
  struct Span {
    std::string name;
    float* data = nullptr;
    std::int64_t numel = 0;
  };
  Span gradient_buffer() const;
  Span parameter_buffer() const;
  // The distributed optimizer's range of the flat buffers (block optimizer_rank of optimizer_shards equal
  // blocks; the whole buffer without shards): offset into the gradient buffer and element count.
  struct Range {
    std::int64_t offset = 0, numel = 0;
  };
  Range optimizer_range() const;
  std::vector<Span> gradient_buffers() const;
  void* stream() const;
  // Data-parallel overlap (cuda_grad_reduce.h): called on the host right after the backward kernels of
  // layer l are enqueued on stream() (l from last to first), so the caller can record an event there and
  // start reducing that layer's gradients while the rest of the backward runs. Empty: none.
  void set_backward_layer_hook(std::function<void(int layer)> hook);
  // After the master weights were written in place (a broadcast into parameter_buffer()): the copies made from
  // them (the norms' fp32 weights). Without optimizer shards only (dlm::Error with them).
  void master_weights_written();
  // With optimizer shards, after apply_adamw(): enqueues on stream() the all-gather of every range's updated
  // bf16 weights and the sum that gives every rank the norms' updated fp32 weights, over `data` (the
  // data-parallel group: optimizer_shards members, this rank optimizer_rank); the caller completes the group.
  // Nothing without shards.
  void share_updated_weights(DeviceGroup& data);
  void synchronize() const;
  // Per MoE layer of this rank (in order), the tokens routed to each expert by the last forward and kept (at most its
  // capacity with a capacity factor; empty before one).
  std::vector<std::vector<std::int64_t>> moe_tokens_per_expert() const;
  // Device memory in use by this model (parameters, optimizer, activations), bytes.
  std::size_t device_bytes() const;
  // Which attention ran the last step: "cudnn <version>" or "own kernel (why)".
  std::string attention_engine() const;
  // With CudaOptions::profile on the whole model: GPU time per phase (GEMMs, attention, norms...) over the
  // steps since the last report; otherwise a header line only.
  std::string profile_report();

  struct Impl;  // the device state, shared by the backend's files (libtrain/backend/cuda/cuda_model_impl.h)

 private:
  // The samplers' forward (tp = pp = 1): logits out, or with greedy set, greedy tokens of the window's
  // columns out and their confidences in *logits.
  void sample_forward(const CudaBatch& batch, std::vector<float>* logits, std::vector<std::int32_t>* greedy,
                      ColumnWindow window, const KvCacheUse& kv);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlm::train
