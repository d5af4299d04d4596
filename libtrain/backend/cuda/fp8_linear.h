// FP8 for CudaModel's linear layers (QKV, attention projection, fc1, fc2) of the layers Fp8Options chooses; the
// embedding, the output layer, the norms, attention and the optimizer keep their precision, and the master weights
// stay fp32 (ParameterStore). With W [n, k] (out, in), x [rows, k], dy [rows, n]:
//   forward   y  = x W^T        x e4m3 (cast from, or fused into, its producer), W e4m3, fast accumulation
//   backward  dx = dy W         dy e5m2 (hybrid) or e4m3, W^T e4m3: the "TN" form needs W's transpose
//             dW += dy^T x      dy^T and x^T, cast transposed from dy and from the kept bf16 x
// Weights are cast (with their transposes) once after they change, at the first forward that follows: the
// optimizer's update, an import or an init mark them (mark_weights_changed); micro-batches and recomputation reuse
// the copies. Scaling per tensor (fp8_cast.h):
//   tensorwise (current scaling, torchao's and Transformer Engine's Float8CurrentScaling): every cast's scale comes
//     from the amax of the very tensor it casts. The amax is taken by the kernel that writes the tensor where one
//     does (RMSNorm forward for the inputs of QKV and fc1; RMSNorm backward for the output gradients of the
//     projection and fc2: producer_out, grad_amax), then one cast pass reads it; SwiGLU's forward and backward run
//     twice instead, an amax pass that writes nothing and then straight into FP8 in both layouts (fc2's input, fc1's
//     output gradient: swiglu_forward, swiglu_backward), which reads less than writing bf16 and casting it after;
//     elsewhere (attention's output, the QKV gradient, a gradient gathered under SP or entering a pipeline stage) an
//     amax pass precedes the cast. The backward's transposed cast of x reuses the scale x was cast with in its
//     forward: the inputs' slots are kept per activation slot (a pipeline schedule's micro-batch in flight), so no
//     amax pass runs for x again and both GEMMs of x see the same scale. The amaxes are zeroed once per micro-batch's
//     forward (inputs) and backward (gradients), each tensor's slot being written by one producer in between.
//   delayed: every slot is updated from its amax history at each micro-batch's forward (begin_forward), Transformer
//     Engine's per-forward update; casts use the scale as it stands and record their tensor's amax for the next, so
//     the producers cast as they write: RMSNorm and SwiGLU forward the inputs, SwiGLU backward fc1's gradient (in
//     FP8 only, both layouts: swiglu_backward).
// A recomputed layer (full recomputation) casts again: tensorwise from the same tensors into the same activation
// slot's scales (the same bits), delayed with the scales as they stand, the same as its first run's unless a
// pipeline schedule ran another micro-batch's forward in between.
// Any row count runs in FP8, in training as forward-only: the rows are the forward's and the input gradient's
// non-contiguous dimension, which cuBLASLt's FP8 kernels take at any size (Gemm::fp8_gemm_fits), and the weight
// gradient's K, over which it runs with the transposed operands x^T and dy^T padded with zero columns to
// fp8_padded_rows (the transposed casts write the pad). In training, the last layer's MLP on the packed loss rows
// runs in bf16 (use()).
// Not yet: the amax reduction over data- and tensor-parallel groups (each rank scales its own tensors).
//
// Forward-only use (Use::kForwardOnly: the samplers' forwards, CudaOptions::fp8_sampling; tensorwise e4m3): only the
// forward GEMM y = x W^T. The weights are cast once after they change (cast_weights, before a forward, outside any
// graph capture), row-major only (no transposes); the inputs are cast per forward with their own amax, into one
// buffer sized for the largest forward (reserve_rows, with the activations) and one set of input slots (no
// activation slots: no backward reads them). Any row count runs in FP8: the rows are the GEMM's non-contiguous
// dimension, which cuBLASLt's FP8 kernels take at any size (fp8_gemm_fits), and the casts here run row-major only
// (RMSNorm's amax fused, a separate amax pass for attention's output; SwiGLU writes bf16 h with its amax fused, then
// one cast pass: the same bytes as the amax pass and the straight-into-FP8 pass of training, at any row count).
// A block KV cache's window forward instead casts its inputs with the scales of the storing forward that filled its
// store (begin_forward_only's `scales`, which keep_input_scales saved): the window's rows are columns that forward
// ran (under the cache's own approximation: its keys are that forward's), so their inputs lie in the same ranges,
// and with the scales known before the forward each input's producer casts as it writes (RMSNorm, the window
// attention, SwiGLU), as delayed scaling's do: no amax pass and no cast pass, four kernels fewer a layer. A value
// beyond the stored scale's range saturates (fp8_cast.h).
// Forward-only, the output layer may run in FP8 too (the constructor's head_tensor; CudaModel passes it for the
// samplers): its weight cast with the others, its input (the final norm's output) cast by that norm as the layers'
// are (head_producer_out, cast_head_input: an input slot of its own, kept with the store's), the logits from one FP8
// GEMM (head_forward) that reads half the bytes of the bf16 one, the largest GEMM of a window step.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "device_arena.h"
#include "dlm/train/fp8.h"
#include "fp8_cast.h"
#include "gemm.h"
#include "parameter_store.h"

namespace dlm::train::cuda {

class Fp8Linears {
 public:
  enum Linear { kQkv, kProj, kFc1, kFc2, kLinears };
  enum class Use { kTraining, kForwardOnly };
  // weights[l]: local layer l's qkv, proj, fc1 and fc2 tensors in `ps`, all present (CudaModel refuses FP8 for MoE
  // models); the layers run in FP8 are those of options.layer_in_fp8(first_layer + l, num_layers). dlm::Error where a
  // width is not a multiple of 16, or for a forward-only use whose recipe is not tensorwise.
  // head_tensor (forward-only; -1: none): the output layer's weight [vocabulary, hidden] in `ps`, run in FP8 as well
  // where both sizes are multiples of 16 (a vocabulary padded otherwise keeps the head bf16: has_head() false).
  Fp8Linears(const Fp8Options& options, const ParameterStore& ps, const std::vector<std::array<int, kLinears>>& weights,
             int first_layer, int num_layers, cudaStream_t stream, Use use = Use::kTraining, int head_tensor = -1);
  Fp8Linears(const Fp8Linears&) = delete;
  Fp8Linears& operator=(const Fp8Linears&) = delete;

  void mark_weights_changed() { weights_stale_ = true; }
  // The weights' FP8 copies (with their transposes in training) cast from `ps` when they changed since the last cast.
  // Forward-only: before every forward, outside a graph capture (a captured forward then reads the copies as cast).
  void cast_weights(const ParameterStore& ps, cudaStream_t stream);
  // A micro-batch's forward begins (rows: its token rows; act_slot: its activation slot, whose backward reads
  // what this forward casts): the delayed update, the weights' casts when they changed, the work buffers for
  // `rows`, the inputs' amaxes zeroed (tensorwise). Training only.
  void begin_forward(const ParameterStore& ps, std::int64_t rows, int act_slot, cudaStream_t stream);
  // Forward-only: the input buffer holds forwards of up to `rows` rows (allocated, outside a graph capture, when it
  // did not: its address moves, so the caller drops captured forwards then, as it does when its activations move).
  void reserve_rows(std::int64_t rows);
  // Forward-only: a forward of `rows` rows (at most reserve_rows') begins: its inputs' amaxes zeroed; or, with
  // `scales` (input_slot_count() slots that keep_input_scales filled), its inputs cast with those slots' scales as
  // they stand, by their producers (producer_out) and without amax passes. Captured with the forward.
  void begin_forward_only(std::int64_t rows, cudaStream_t stream, Fp8Slot* scales = nullptr);
  // Forward-only: the input slots of the forward just enqueued (their scales and inverses) copied into `to`.
  void keep_input_scales(Fp8Slot* to, cudaStream_t stream) const;
  std::int64_t input_slot_count() const { return static_cast<std::int64_t>(weights_.size()); }
  // A micro-batch's backward begins, of the forward that ran in act_slot: the gradients' amaxes zeroed (tensorwise).
  // Before the first producer of a gradient (the head's RMSNorm backward).
  void begin_backward(int act_slot, cudaStream_t stream);
  // Whether local layer l's linear layers run in FP8 at `rows` rows: an FP8 layer at the micro-batch's full row count
  // (begin_forward's, or begin_forward_only's), whatever that count. The last layer's MLP on the packed loss rows
  // stays bf16: its row count changes every micro-batch, and each new count would be a new FP8 GEMM shape whose
  // algorithm is asked for and timed anew (Gemm's tuning waits on the device), where the bf16 GEMMs reuse one for the
  // family (Gemm::RowFamily).
  bool use(int l, int rows) const { return base_[static_cast<std::size_t>(l)] >= 0 && rows == rows_; }

  // The forward's input cast. Fused: the Fp8Out for the kernel that produces x (rmsnorm_forward, swiglu_forward),
  // then cast_input(..., fused = true); otherwise cast_input alone.
  Fp8Out producer_out(int l, Linear g, cudaStream_t stream);
  void cast_input(int l, Linear g, const bf16* x, int rows, bool fused, cudaStream_t stream);
  // fc2 of local layer l at `rows` rows, where use(l, rows) (fc2's input width ffn is then a multiple of 16, as
  // the constructor requires), h: the layer's bf16 h buffer [rows, ffn]. Training: SwiGLU's forward straight into
  // FP8 (swiglu_forward_fp8; tensorwise after an amax pass): fc2's input for the forward GEMM, and its transpose into
  // h's bytes ([ffn, fp8_padded_rows(rows)] FP8: nothing else reads h then; the activation layout gives h at least
  // 8 rows, so that the padded rows fit in its bytes), kept with the scale it was cast with for the backward,
  // whose x^T cast it replaces (cast_backward). Forward-only: h written in bf16 with its amax, then cast (no
  // transpose). Takes cast_input's place for fc2.
  void swiglu_forward(int l, const bf16* gu, int rows, int ffn, bf16* h, cudaStream_t stream);
  // y [rows, n] (leading dimension n) = x W^T, from the input cast_input just cast.
  void forward(Gemm& gemm, int l, Linear g, int rows, bf16* y, cudaStream_t stream);
  // Forward-only, with head_tensor: the output layer's input cast (as producer_out and cast_input: the final norm's
  // output, `rows` rows into the cast buffer), and logits [rows, vocabulary] (leading dimension ldy) = x W^T from
  // FP8 rows x [rows, hidden] (head_input() + a row offset, or those rows gathered elsewhere).
  bool has_head() const { return head_ >= 0; }
  Fp8Out head_producer_out() const;
  void cast_head_input(const bf16* x, int rows, bool fused, cudaStream_t stream);
  const fp8* head_input() const { return xq_; }
  void head_forward(Gemm& gemm, const fp8* x, int rows, bf16* y, int ldy, cudaStream_t stream);
  // The backward's calls below are training's only.
  // For the kernel that writes linear g's whole output gradient dy [rows, n] (tensorwise): the slot into which it
  // maxes dy's amax (rmsnorm_backward's dres_amax: the projection's and fc2's), and cast_backward then casts dy
  // without an amax pass of its own. Null where no amax is wanted (delayed, or the linear in bf16 at `rows`).
  Fp8Slot* grad_amax(int l, Linear g, int rows);
  // fc1 of local layer l at `rows` rows, where use(l, rows): SwiGLU's backward straight into FP8, fc1's output
  // gradient in both layouts (swiglu_backward_fp8; tensorwise after an amax pass); cast_backward then takes dy null.
  void swiglu_backward(int l, const bf16* dh, const bf16* gu, int rows, int ffn, cudaStream_t stream);
  // The backward's operands: dy [rows, n] cast in both layouts (null: swiglu_backward wrote them), and x^T from x,
  // the forward's bf16 input (unless the forward kept x^T: swiglu_forward).
  void cast_backward(int l, Linear g, int rows, const bf16* dy, const bf16* x, cudaStream_t stream);
  // From the operands cast_backward just cast: the weight gradient dw (fp32 [n, k]) = beta dw + dy^T x, and the
  // input gradient dx [rows, k] = dy W (two calls, so that a profile times each GEMM apart).
  void backward_weight(Gemm& gemm, int l, Linear g, int rows, float* dw, float beta, cudaStream_t stream);
  void backward_data(Gemm& gemm, int l, Linear g, int rows, bf16* dx, cudaStream_t stream);
  std::size_t device_bytes() const { return weight_arena_.bytes() + work_arena_.bytes() + slot_arena_.bytes(); }

 private:
  enum Operand { kX, kW, kDy, kOperands };
  struct Weight {
    int tensor, n, k;
    fp8 *w8, *wt8;  // [n, k] and its transpose [k, n] (null forward-only)
  };
  int index(int l, Linear g) const { return base_[static_cast<std::size_t>(l)] + g; }
  bool tensorwise() const { return options_.recipe == Fp8Options::Recipe::kTensorwise; }
  // Whether the inputs are cast with their slots' scales as they stand (by their producers where those cast):
  // delayed, or a forward-only forward given stored scales; otherwise each from its own amax.
  bool inputs_prescaled() const { return !tensorwise() || fixed_x_slots_; }
  // x's slot: tensorwise the current activation slot's (or begin_forward_only's stored ones), delayed the linear's
  // own (its history's).
  Fp8Slot* slot(int l, Linear g, Operand o) const { return slot_at(index(l, g), o); }
  Fp8Slot* slot_at(int i, Operand o) const {
    if (o == kX && fixed_x_slots_) return fixed_x_slots_ + i;
    if (o == kX && tensorwise()) return x_slots_[static_cast<std::size_t>(act_slot_)] + i;
    return slots_ + i * kOperands + o;
  }
  Fp8Out producer_out_at(int i) const;  // producer_out of weights_[i]'s input
  // Casts x [rows, weights_[i].k] into xq_ with its input slot: fused (the producer cast it, or took its amax), or
  // after an amax pass of its own (current scaling).
  void cast_input_at(int i, const bf16* x, int rows, bool fused, cudaStream_t stream);
  // y [rows, n] (leading dimension ldy) = x W^T for weights_[i], x FP8 rows [rows, k] cast with its input slot.
  void forward_at(Gemm& gemm, int i, const fp8* x, int rows, bf16* y, int ldy, cudaStream_t stream);
  const Weight& weight(int l, Linear g) const { return weights_[static_cast<std::size_t>(base_[static_cast<std::size_t>(l)] + g)]; }
  // Casts x [rows, cols] with slot s into out and/or out_t: tensorwise after its own amax, delayed as it stands.
  void cast(const bf16* x, int rows, int cols, Fp8Slot* s, bool e5m2, fp8* out, fp8* out_t, cudaStream_t stream);
  // The work buffers for at least `rows` rows (training's gradient buffers too), reallocated when they held fewer.
  void grow_work(std::int64_t rows);
  // Activation slot `act_slot`'s input slots (and kept transposes), allocated when new.
  void ensure_act_slot(int act_slot);

  Fp8Options options_;
  std::vector<int> base_;         // per local layer: its first linear's index, -1 in bf16
  std::vector<Weight> weights_;   // per FP8 linear, then the output layer's (head_)
  int head_ = -1;                 // the output layer's index in weights_, or -1
  Fp8Slot* slots_ = nullptr;      // per FP8 linear, per operand
  float* history_ = nullptr;      // per slot, amax_history_len (delayed)
  // Per activation slot, per FP8 linear: tensorwise its input's slot; delayed the scale_inv of a kept x^T.
  std::vector<Fp8Slot*> x_slots_;
  Fp8Slot* fixed_x_slots_ = nullptr;  // forward-only: the stored input scales of the current forward, or null
  std::vector<std::vector<const fp8*>> kept_t_;  // per activation slot, per FP8 linear: x^T kept by the forward
  const fp8* xt_ = nullptr;                     // the x^T and its scale_inv the next backward_weight reads
  const float* xt_scale_inv_ = nullptr;
  int act_slot_ = 0;
  std::vector<char> dy_amax_ready_;  // per FP8 linear: grad_amax was handed out, cast_backward skips the amax pass
  int slot_count_ = 0, max_k_ = 0, max_n_ = 0;
  std::int64_t work_rows_ = 0, rows_ = 0;  // the work buffers' rows; the current micro-batch's
  // [rows, max_k] (x) or [max_k, padded rows] (x^T); [rows, max_n]; [max_n, padded rows] (fp8_padded_rows)
  fp8 *xq_ = nullptr, *dy8_ = nullptr, *dyt8_ = nullptr;
  bool weights_stale_ = true;
  bool forward_only_ = false;
  DeviceArena slot_arena_, weight_arena_, work_arena_;
};

}  // namespace dlm::train::cuda
