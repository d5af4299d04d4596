// Model: the Llama/Qwen3-style transformer dlm trains, written once against the backend seam.
//
// Per layer (pre-norm, no biases):
//   a = RMSNorm(x) ; qkv = a Wqkv^T -> q [N,H,D], k, v [N,G,D] (Megatron's fused rows, model_config.h)
//   q, k = RMSNorm per head (QK-norm, Qwen3; optional) ; q, k = RoPE(q, k, positions)
//   x = x + Attention(q, k, v; bidirectional or causal, GQA) Wo^T
//   x = x + (silu(b Wgate^T) * b Wup^T) Wdown^T,  b = RMSNorm(x)
//       or, in a mixture-of-experts layer, x = x + sum_j w_j SwiGLU_{e_j}(b) over the router's top-k experts
//       e_j of b (moe_router.h, docs/moe.md)
// then logits = RMSNorm(x) Wout^T, Wout = the embedding table when tied. The logits have
// padded_vocab_size() columns; cross_entropy() slices them to vocab_size, so a padded column never
// enters a loss (the logits adapter in model_adapters.h sets them to -inf for samplers).
//
// Parameters and gradients are backend tensors named by the global names of model_tensors(config)
// (the checkpoint's and libckpt's HF mapping's names); host import/export is fp32 by name.
//
// A training step:  model.forward(input); ce = model.cross_entropy(labels);
//                   model.backward(weights);   // d loss / d ce_i, added into every gradient
// forward() keeps its activations until the next forward(); backward() needs the cross_entropy() of the
// same forward.
//
// Model parallelism (ModelShard below; docs/parallelism.md): a Model can be one rank's part of a model in
// Megatron's layout: the layers of one pipeline chunk, every tensor cut to the tensor-parallel shard that
// libckpt's sharding.h defines (QKV and gate/up column-parallel, proj and down row-parallel, embedding and
// output vocab-parallel, norms replicated). The collectives sit where Megatron puts them:
//   TP:      column-parallel input: identity forward, all-reduce of its gradient backward;
//            row-parallel output: all-reduce forward, identity backward;
//            embedding: masked lookup of this rank's vocabulary rows, all-reduce;
//            cross-entropy over vocabulary shards: max, sum of exponentials and the label's logit
//            all-reduced (no rank ever holds a full row of logits).
//   TP + SP: the residual stream, norms and embedding output hold 1/TP of the token rows (rows
//            [r N/TP, (r+1) N/TP) of the [batch * seq] rows); all-gather before each column-parallel
//            linear (reduce-scatter of its input gradient), reduce-scatter after each row-parallel one
//            (all-gather of its output gradient).
//   MoE:     (TP) each expert and the shared expert sharded as the dense MLP (fc1 column-, fc2 row-parallel),
//            reading the same N rows and reduced the same way; the router replicated (model_moe.cpp).
//   EP:      (MoE layers) each rank of the expert group holds E / EP experts; the router runs on every rank's own
//            tokens, the routed rows go to their experts' ranks by all-to-all (counts first, then the rows), come
//            back by the reverse all-to-all and are combined where they started; the backward mirrors it.
//   PP:      a chunk without the embedding takes its input hidden states (ModelInput::input_hidden), one without
//            the head returns its output hidden states from forward() and starts backward() from their
//            gradient (backward_from_output); input_gradient() is what goes back to the previous chunk.
// Replicated tensors whose gradient each rank sees only in part (norms under SP, QK-norm under TP) are
// summed over the tensor group by reduce_shared_gradients(), once per step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/tensor.h"
#include "dlm/ckpt/sharding.h"
#include "dlm/train/backend.h"
#include "dlm/train/communicator.h"
#include "dlm/train/moe_metrics.h"

namespace dlm::train {

// Whether a replicated tensor's gradient is only this tensor rank's part, to be summed over the tensor group
// (one rule for every backend): QK-norm weights always (each rank normalises its own heads), the other norms
// under sequence parallelism (each rank its own token rows); nothing when tp == 1.
bool gradient_summed_over_tensor_group(std::string_view name, bool is_norm, int tp, bool sequence_parallel);

// This process's part of the model. `layout` is libckpt's (layout.pp counts every pipeline chunk:
// pipeline stages x virtual stages), `stage` is this chunk's place among them; the tensor-parallel
// rank is the tensor group's. The default is the whole model on one process.
struct ModelShard {
  ckpt::ParallelLayout layout{};
  int stage = 0;
  Communicator* tensor = nullptr;  // the tensor-parallel group, layout.tp members (null when tp == 1)
  bool sequence_parallel = false;  // --sequence-parallel (needs tp > 1 to do anything)
  Communicator* expert = nullptr;  // the expert-parallel group, layout.ep members (null when ep == 1)
};

// One micro-batch on the host, [batch, seq] row-major.
struct ModelInput {
  std::int64_t batch = 0, seq = 0;
  std::span<const std::int32_t> ids;
  std::span<const std::int32_t> positions;  // empty: 0 .. seq-1 in every row
  std::span<const std::uint8_t> key_valid;  // empty: every key visible; 0 = padding, never attended
  AttentionKind attention = AttentionKind::kBidirectional;
  // A pipeline chunk without the embedding: its input hidden states [local_rows(batch * seq), hidden]
  // (ids must still be given: they are checked, and positions default from them).
  std::span<const float> input_hidden;
};

struct Parameter {
  ckpt::TensorSpec spec;  // global name, this rank's (local) shape, is_norm (no weight decay)
  Tensor value, grad;
  ckpt::TensorShard shard;  // where the local tensor sits in the global one
  int global_index = 0;     // position in model_tensors(config): init()'s stream
  // Counted in the global gradient norm: false for the copies another rank counts (norms on tensor ranks
  // other than 0, the tied embedding's replica on the last pipeline stage).
  bool in_grad_norm = true;
};

class Model {
 public:
  // Checks the config (check_config) before allocating anything; gradients start at zero, values
  // undefined until init() or import_weights().
  Model(ckpt::ModelConfig config, Backend& backend, ModelShard shard = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // A dlm::Error naming the field when the shape cannot be built: ModelConfig::validate() plus heads
  // not dividing hidden_size, KV groups not dividing heads.
  static void check_config(const ckpt::ModelConfig& config);
  // A dlm::Error before any compute when the input does not fit: sizes, seq or a position beyond
  // max_position_embeddings, ids outside [0, vocab_size).
  void check_input(const ModelInput& input) const;

  const ckpt::ModelConfig& config() const { return config_; }
  const ModelShard& shard() const { return shard_; }
  bool pre_process() const { return shard_.stage == 0; }                     // holds the embedding
  bool post_process() const { return shard_.stage == shard_.layout.pp - 1; }  // holds the head
  int tensor_parallel_size() const { return shard_.layout.tp; }
  // The rows of the hidden states this rank holds for `tokens` = batch * seq tokens (1/TP under SP).
  std::int64_t local_rows(std::int64_t tokens) const;
  Backend& backend() const { return backend_; }
  // The config's attention (bidirectional for diffusion models, causal for AR).
  AttentionKind default_attention() const;

  // Megatron's init: every matrix ~ N(0, init_method_std^2) (padded vocabulary rows included), norms
  // 1. Deterministic in `seed`, and each tensor's values depend only on (seed, its name's position):
  // a shard holds the very values of its slice of the whole model's tensor, whatever the layout.
  void init(std::uint64_t seed);

  // Parameters in model_tensors(config) order; values and gradients stay in the backend.
  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  const Parameter& parameter(std::string_view name) const;  // dlm::Error for an unknown name
  std::int64_t parameter_count() const;
  void zero_grad();

  // Host fp32 copies by global name, this rank's local shape (model_tensors' shape on one process).
  void import_parameter(std::string_view name, std::span<const float> values);
  std::vector<float> export_parameter(std::string_view name) const;
  std::vector<float> export_gradient(std::string_view name) const;
  // Every tensor of model_tensors(config), fp32 with its global shape (a shard takes its slice); a
  // missing, extra or misshapen tensor is a dlm::Error naming it.
  void import_weights(const ckpt::TensorSet& weights);
  // This rank's tensors, local shapes (the whole model on one process).
  ckpt::TensorSet export_weights() const;

  // Runs the model; returns the logits [batch * seq, padded_vocab_size() / TP] (backend memory, valid
  // until the next forward of the same slot), or on a chunk without the head its output hidden states
  // [local_rows, hidden].
  const Tensor& forward(const ModelInput& input);
  // Pipelines keep several micro-batches in flight: each slot holds one's activations (slot 0 by default).
  void use_slot(int slot);

  // Sampling with a block KV cache (Fast-dLLM; the samplers' CachedLogitsModel in sampler.h):
  // forward_storing_kv() is forward() that also keeps every layer's keys (after QK-norm and RoPE) and
  // values of every position. forward_window() then runs only the columns [first, end) of each row
  // through the embedding, the layers and the head: their queries attend to their own keys and values,
  // computed now, and at every other column to the stored ones (the input's ids there are not read; its
  // positions are, and its key_valid masks the keys). Returns the window's logits [batch * (end - first), padded vocabulary].
  // Right after forward_storing_kv() of the same input, the window's logits are the full forward's rows
  // (the same math; a backend's GEMM may sum in another order for another row count).
  // A window call leaves the store as it was. Whole model only (no tensor or pipeline parallelism), the
  // config's bidirectional attention, the stored batch's shape; a dlm::Error otherwise. The window runs in
  // activation slot 1, so slot 0 keeps the full forward's shape.
  const Tensor& forward_storing_kv(const ModelInput& input);
  const Tensor& forward_window(const ModelInput& input, std::int64_t first, std::int64_t end);
  // Per-token cross-entropy of the last forward's logits against labels [batch * seq] (label < 0:
  // ignored, 0). Host values.
  std::vector<float> cross_entropy(std::span<const std::int32_t> labels);
  // Adds d(sum_i weights_i * ce_i + router_loss_weight * R) / d(parameter) into every gradient; weights
  // [batch * seq]. R is the sum over this chunk's MoE layers of their aux and z losses (moe_stats(); 0 for a
  // dense model); router_loss_weight is Megatron's MoEAuxLossAutoScaler scale (1 / micro-batches).
  void backward(std::span<const float> weights, double router_loss_weight = 1.0);
  // A chunk without the head: backward from d loss / d (its output hidden states) [local_rows, hidden].
  void backward_from_output(std::span<const float> d_output, double router_loss_weight = 1.0);
  // The router of each of this chunk's MoE layers in the last forward (docs/moe.md).
  struct MoeLayerStats {
    int layer = 0;                                 // global layer index
    double aux_loss = 0, z_loss = 0;               // coefficients applied
    std::vector<std::int64_t> tokens_per_expert;   // [experts]
    std::vector<double> aux_probability_sum;       // [experts] sum over tokens of the aux loss's scores
  };
  std::vector<MoeLayerStats> moe_stats() const;
  // The sums of every forward's MoE metrics since the last call (moe_metrics.h), and a fresh start.
  MoeStepSums take_moe_sums();
  // After backward() on a chunk without the embedding: d loss / d (its input hidden states).
  std::vector<float> input_gradient() const;
  // Sums over the tensor group the gradients of replicated tensors that each rank computed in part (see
  // the top of this header); call once after a step's last backward. Collective over the tensor group.
  void reduce_shared_gradients();
  // Whether reduce_shared_gradients() still sums this parameter's gradient over the tensor group.
  bool gradient_shared_over_tensor_group(const Parameter& p) const;
  // --overlap-grad-reduce: called with a parameter's index into parameters() once a backward has added its
  // last contribution to that gradient (the head's, then each layer's from the last down, the embedding
  // last), so its bucket can be reduced while the rest of the backward runs. Empty: none.
  void set_gradient_hook(std::function<void(std::size_t)> hook) { gradient_hook_ = std::move(hook); }

 private:
  struct Layer;
  struct Activations;
  struct KvStore;
  void allocate_activations(std::int64_t batch, std::int64_t seq);
  // forward() over input's rows; `store`: keep each layer's keys and values in kv_; window_first >= 0:
  // input is a window of kv_'s rows at that column, attending to kv_'s keys and values with its own
  // written over its columns.
  const Tensor& forward_pass(const ModelInput& input, bool store, std::int64_t window_first);
  // forward_pass's steps (model_kv_cache.cpp): layer l's keys and values into kv_; kv_'s scratch with
  // the window's keys and values written over columns [first, first + window) of each row.
  void store_kv(std::size_t l, const Tensor& k, const Tensor& v);
  const KvStore& window_kv(std::size_t l, const Tensor& k, const Tensor& v, std::int64_t first);
  void allocate_gradients();
  void backward_layers();
  // One MoE layer's MLP (model_moe.cpp): from its normed input to `out` (written), and back to a.dxn.
  void moe_forward(std::size_t layer, const Tensor& out);
  void moe_backward(std::size_t layer);
  // The experts' part under expert parallelism (model_moe_dispatch.cpp): dispatch of `input`'s rows, this rank's
  // experts, combine into `out` (written); back from d out to d input (written).
  void expert_parallel_forward(std::size_t layer, const Tensor& input, const Tensor& out);
  void expert_parallel_backward(std::size_t layer, const Tensor& dout, const Tensor& dinput);
  // Tensor-parallel plumbing (model_tensor_parallel.cpp).
  void tp_all_reduce(const Tensor& t) const;
  void gather_rows(const Tensor& local, const Tensor& full) const;        // SP: all-gather of token rows
  void scatter_rows_sum(const Tensor& full, const Tensor& local) const;  // SP: reduce-scatter of token rows
  // Column-parallel input: `x` as the linear needs it ([N, .] full rows), and its gradient back.
  const Tensor& column_input(const Tensor& local, const Tensor& gathered) const;
  // What column_input() returned in the forward (no communication).
  const Tensor& gathered(const Tensor& local, const Tensor& full) const {
    return shard_.sequence_parallel ? full : local;
  }
  void column_input_backward(const Tensor& dfull, const Tensor& dlocal) const;
  // Row-parallel output: the partial product `partial` [N, .] reduced into `out` (local rows).
  void row_output(const Tensor& partial, const Tensor& out) const;
  void row_output_backward(const Tensor& dlocal, const Tensor& dfull) const;
  std::vector<float> vocab_parallel_cross_entropy(std::span<const std::int32_t> labels);
  void vocab_parallel_ids(std::span<const std::int32_t> ids, std::vector<std::int32_t>& local) const;

  ckpt::ModelConfig config_;
  Backend& backend_;
  ModelShard shard_;
  std::vector<Parameter> params_;
  std::vector<Layer> layers_;
  int first_layer_ = 0;
  int embedding_ = -1, final_norm_ = -1, output_ = -1;  // indices into params_ (-1: not on this chunk)
  std::int64_t vocab_begin_ = 0;  // first padded-vocabulary row of this rank's embedding/output shard
  std::vector<std::shared_ptr<Activations>> slots_;
  std::shared_ptr<KvStore> kv_;  // forward_storing_kv()'s keys and values
  std::shared_ptr<Activations> acts_;
  int slot_ = 0;
  double router_loss_weight_ = 1.0;  // of the backward in progress
  std::vector<double> moe_sums_;     // take_moe_sums()'s values since the last call
  std::function<void(std::size_t)> gradient_hook_;
  void gradient_done(int param) const {
    if (gradient_hook_ && param >= 0) gradient_hook_(static_cast<std::size_t>(param));
  }
};

}  // namespace dlm::train
