// Fp8Linears (fp8_linear.h): the slots, the weights' FP8 copies and the casts and GEMMs of a linear layer.
#include "fp8_linear.h"

#include <algorithm>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train::cuda {

Fp8Linears::Fp8Linears(const Fp8Options& options, const ParameterStore& ps,
                       const std::vector<std::array<int, kLinears>>& weights, int first_layer, int num_layers,
                       cudaStream_t stream, Use use, int head_tensor)
    : options_(options), forward_only_(use == Use::kForwardOnly) {
  if (forward_only_ && !tensorwise()) fail("FP8: a forward-only use scales tensorwise (current scaling)");
  if (head_tensor >= 0 && !forward_only_) fail("FP8: the output layer runs in FP8 only forward-only");
  for (std::size_t l = 0; l < weights.size(); ++l) {
    if (!options.layer_in_fp8(first_layer + static_cast<int>(l), num_layers)) {
      base_.push_back(-1);
      continue;
    }
    base_.push_back(static_cast<int>(weights_.size()));
    for (int t : weights[l]) {
      const auto& shape = ps.specs[static_cast<std::size_t>(t)].local_shape;
      const int n = static_cast<int>(shape[0]), k = static_cast<int>(shape[1]);
      if (n % 16 != 0 || k % 16 != 0)
        fail(fmt::format("FP8: '{}' is {}x{} on this rank; FP8 GEMMs need both sizes multiples of 16",
                         ps.specs[static_cast<std::size_t>(t)].name, n, k));
      const std::int64_t numel = std::int64_t{n} * k;
      fp8* w8 = weight_arena_.alloc<fp8>(numel);
      weights_.push_back({t, n, k, w8, forward_only_ ? nullptr : weight_arena_.alloc<fp8>(numel)});
      max_n_ = std::max(max_n_, n), max_k_ = std::max(max_k_, k);
    }
  }
  if (head_tensor >= 0) {
    const auto& shape = ps.specs[static_cast<std::size_t>(head_tensor)].local_shape;
    const int n = static_cast<int>(shape[0]), k = static_cast<int>(shape[1]);
    // An output layer FP8 GEMMs cannot take (a vocabulary padded to no multiple of 16) stays bf16.
    if (n % 16 == 0 && k % 16 == 0) {
      head_ = static_cast<int>(weights_.size());
      weights_.push_back({head_tensor, n, k, weight_arena_.alloc<fp8>(std::int64_t{n} * k), nullptr});
      max_k_ = std::max(max_k_, k);  // its input shares the cast buffer (its n is no operand's width here)
    }
  }
  dy_amax_ready_.assign(weights_.size(), 0);
  slot_count_ = static_cast<int>(weights_.size()) * kOperands;
  std::vector<Fp8Slot> init;
  for (std::size_t i = 0; i < weights_.size(); ++i)
    for (int o = 0; o < kOperands; ++o) init.push_back({.scale_inv = 1.0f, .amax = 0.0f, .scale = 1.0f, .fp8_max = o == kDy ? options.grad_max() : kFp8E4m3Max});
  slots_ = slot_arena_.alloc<Fp8Slot>(slot_count_);
  history_ = slot_arena_.alloc<float>(std::int64_t{slot_count_} * options.amax_history_len);
  check_cuda(cudaMemcpyAsync(slots_, init.data(), init.size() * sizeof(Fp8Slot), cudaMemcpyHostToDevice, stream),
             "FP8 slots");
  check_cuda(cudaMemsetAsync(history_, 0, sizeof(float) * slot_count_ * options.amax_history_len, stream),
             "FP8 history");
  check_cuda(cudaStreamSynchronize(stream), "FP8 slots");  // `init` leaves scope
  if (forward_only_) ensure_act_slot(0);  // the one set of input slots
}

void Fp8Linears::cast(const bf16* x, int rows, int cols, Fp8Slot* s, bool e5m2, fp8* out, fp8* out_t,
                      cudaStream_t stream) {
  if (tensorwise()) {
    check_cuda(cudaMemsetAsync(&s->amax, 0, sizeof(float), stream), "FP8 amax");
    fp8_amax(x, std::int64_t{rows} * cols, s, stream);
  }
  fp8_quantize(x, rows, cols, {s, e5m2, tensorwise(), options_.margin_factor()}, out, out_t, stream);
}

namespace {

// slot->amax = 0 for `count` slots `stride` slots apart, in one call.
void zero_amaxes(Fp8Slot* first, int count, int stride, cudaStream_t stream) {
  if (count > 0)
    check_cuda(cudaMemset2DAsync(&first->amax, sizeof(Fp8Slot) * stride, 0, sizeof(float), count, stream),
               "FP8 amaxes");
}

}  // namespace

void Fp8Linears::cast_weights(const ParameterStore& ps, cudaStream_t stream) {
  if (!weights_stale_) return;
  for (std::size_t i = 0; i < weights_.size(); ++i) {
    const Weight& w = weights_[i];
    cast(ps.W(w.tensor), w.n, w.k, slots_ + i * kOperands + kW, false, w.w8, w.wt8, stream);
  }
  weights_stale_ = false;
}

void Fp8Linears::grow_work(std::int64_t rows) {
  if (rows <= work_rows_) return;
  work_arena_.release();
  const std::int64_t padded = fp8_padded_rows(rows);  // x^T and dy^T: [k, padded] and [n, padded]
  xq_ = work_arena_.alloc<fp8>(padded * max_k_);
  if (!forward_only_) dy8_ = work_arena_.alloc<fp8>(rows * max_n_), dyt8_ = work_arena_.alloc<fp8>(padded * max_n_);
  work_rows_ = rows;
}

void Fp8Linears::ensure_act_slot(int act_slot) {
  while (x_slots_.size() <= static_cast<std::size_t>(act_slot)) {
    // Scale 1 until the first amax (fp8_scale keeps the previous scale for an amax of 0).
    const std::vector<Fp8Slot> init(weights_.size(), {.scale_inv = 1.0f, .amax = 0.0f, .scale = 1.0f, .fp8_max = kFp8E4m3Max});
    Fp8Slot* s = slot_arena_.alloc<Fp8Slot>(static_cast<std::int64_t>(init.size()));
    check_cuda(cudaMemcpy(s, init.data(), init.size() * sizeof(Fp8Slot), cudaMemcpyHostToDevice), "FP8 slots");
    x_slots_.push_back(s);
    kept_t_.emplace_back(weights_.size(), nullptr);
  }
}

void Fp8Linears::begin_forward(const ParameterStore& ps, std::int64_t rows, int act_slot, cudaStream_t stream) {
  if (weights_.empty()) return;
  if (!tensorwise())
    fp8_update_delayed(slots_, history_, slot_count_, options_.amax_history_len,
                       options_.amax_algo == Fp8Options::AmaxAlgo::kMax, options_.margin_factor(), stream);
  cast_weights(ps, stream);
  rows_ = rows;
  grow_work(rows);
  act_slot_ = act_slot;
  ensure_act_slot(act_slot);
  if (tensorwise()) zero_amaxes(x_slots_[static_cast<std::size_t>(act_slot)], static_cast<int>(weights_.size()), 1, stream);
}

void Fp8Linears::reserve_rows(std::int64_t rows) {
  if (!weights_.empty()) grow_work(rows);
}

void Fp8Linears::begin_forward_only(std::int64_t rows, cudaStream_t stream, Fp8Slot* scales) {
  fixed_x_slots_ = nullptr;
  if (weights_.empty()) return;
  if (rows > work_rows_)
    fail(fmt::format("FP8: a forward of {} rows, but the input buffer holds {} (reserve_rows)", rows, work_rows_));
  rows_ = rows;
  if (scales) {
    fixed_x_slots_ = scales;
    return;
  }
  zero_amaxes(x_slots_[0], static_cast<int>(weights_.size()), 1, stream);
}

void Fp8Linears::keep_input_scales(Fp8Slot* to, cudaStream_t stream) const {
  if (weights_.empty()) return;
  check_cuda(cudaMemcpyAsync(to, x_slots_[0], weights_.size() * sizeof(Fp8Slot), cudaMemcpyDeviceToDevice, stream),
             "FP8 input scales");
}

void Fp8Linears::begin_backward(int act_slot, cudaStream_t stream) {
  act_slot_ = act_slot;
  std::fill(dy_amax_ready_.begin(), dy_amax_ready_.end(), 0);
  if (tensorwise()) zero_amaxes(slots_ + kDy, static_cast<int>(weights_.size()), kOperands, stream);
}

Fp8Out Fp8Linears::producer_out(int l, Linear g, cudaStream_t) { return producer_out_at(index(l, g)); }

Fp8Out Fp8Linears::producer_out_at(int i) const {
  Fp8Slot* s = slot_at(i, kX);
  // With stored scales (a KV-cache window) the cast alone: no amax is wanted, and the slot's inverse is set.
  if (inputs_prescaled()) return {xq_, s, false, fixed_x_slots_ == nullptr};
  return {nullptr, s, false};  // the amax alone (zeroed by begin_forward): cast_input casts with the scale it gives
}

void Fp8Linears::cast_input(int l, Linear g, const bf16* x, int rows, bool fused, cudaStream_t stream) {
  cast_input_at(index(l, g), x, rows, fused, stream);
}

Fp8Out Fp8Linears::head_producer_out() const { return producer_out_at(head_); }

void Fp8Linears::cast_head_input(const bf16* x, int rows, bool fused, cudaStream_t stream) {
  cast_input_at(head_, x, rows, fused, stream);
}

void Fp8Linears::head_forward(Gemm& gemm, const fp8* x, int rows, bf16* y, int ldy, cudaStream_t stream) {
  forward_at(gemm, head_, x, rows, y, ldy, stream);
}

void Fp8Linears::cast_input_at(int i, const bf16* x, int rows, bool fused, cudaStream_t stream) {
  const Weight& w = weights_[static_cast<std::size_t>(i)];
  Fp8Slot* s = slot_at(i, kX);
  const bool current = !inputs_prescaled();
  if (fused && !current) return;  // the producer cast it
  if (!fused && current) fp8_amax(x, std::int64_t{rows} * w.k, s, stream);  // zeroed by begin_forward
  fp8_quantize(x, rows, w.k, {s, false, current, options_.margin_factor()}, xq_, nullptr, stream);
}

void Fp8Linears::swiglu_forward(int l, const bf16* gu, int rows, int ffn, bf16* h, cudaStream_t stream) {
  const auto i = static_cast<std::size_t>(index(l, kFc2)), a = static_cast<std::size_t>(act_slot_);
  Fp8Slot* s = slot(l, kFc2, kX);
  if (forward_only_) {
    // h with its amax (into the slot begin_forward_only zeroed), then the row-major cast; with stored scales h
    // straight into FP8 as well (the producer's cast, as producer_out gives it).
    const Fp8Out f8 = producer_out(l, kFc2, stream);
    cuda::swiglu_forward(gu, h, rows, ffn, stream, &f8);
    return cast_input(l, kFc2, h, rows, true, stream);
  }
  fp8* keep_t = reinterpret_cast<fp8*>(h);
  // Tensorwise, h's amax into its activation slot's (zeroed by begin_forward; a recomputation's is the same).
  if (tensorwise()) swiglu_forward_amax(gu, rows, ffn, s, stream);
  swiglu_forward_fp8(gu, rows, ffn, {s, false, tensorwise(), options_.margin_factor()}, xq_, keep_t, stream);
  // The scale keep_t was cast with, for the backward (a pipeline schedule's next forward may move the slot's);
  // tensorwise s is the activation slot's own.
  if (!tensorwise())
    check_cuda(cudaMemcpyAsync(&x_slots_[a][i].scale_inv, &s->scale_inv, sizeof(float), cudaMemcpyDeviceToDevice,
                               stream),
               "FP8 kept scale");
  kept_t_[a][i] = keep_t;
}

Fp8Slot* Fp8Linears::grad_amax(int l, Linear g, int rows) {
  if (!tensorwise() || !use(l, rows)) return nullptr;
  dy_amax_ready_[static_cast<std::size_t>(index(l, g))] = 1;
  return slot(l, g, kDy);
}

void Fp8Linears::forward(Gemm& gemm, int l, Linear g, int rows, bf16* y, cudaStream_t stream) {
  forward_at(gemm, index(l, g), xq_, rows, y, weight(l, g).n, stream);
}

void Fp8Linears::forward_at(Gemm& gemm, int i, const fp8* x, int rows, bf16* y, int ldy, cudaStream_t stream) {
  const Weight& w = weights_[static_cast<std::size_t>(i)];
  gemm.run_fp8(rows, w.n, w.k, {x, w.k, false, &slot_at(i, kX)->scale_inv},
               {w.w8, w.k, false, &slot_at(i, kW)->scale_inv}, y, false, ldy, 0.0f, true, stream);
}

void Fp8Linears::swiglu_backward(int l, const bf16* dh, const bf16* gu, int rows, int ffn, cudaStream_t stream) {
  Fp8Slot* s = slot(l, kFc1, kDy);
  if (tensorwise()) swiglu_backward_amax(dh, gu, rows, ffn, s, stream);  // zeroed by begin_backward
  swiglu_backward_fp8(dh, gu, rows, ffn, {s, options_.grads_e5m2(), tensorwise(), options_.margin_factor()}, dy8_,
                      dyt8_, stream);
}

void Fp8Linears::cast_backward(int l, Linear g, int rows, const bf16* dy, const bf16* x, cudaStream_t stream) {
  const Weight& w = weight(l, g);
  Fp8Slot *sx = slot(l, g, kX), *sdy = slot(l, g, kDy);
  char& ready = dy_amax_ready_[static_cast<std::size_t>(index(l, g))];
  if (dy) {
    // Tensorwise: dy's amax from its producer (grad_amax) or from a pass here, into the slot begin_backward zeroed.
    if (tensorwise() && !ready) fp8_amax(dy, std::int64_t{rows} * w.n, sdy, stream);
    fp8_quantize(dy, rows, w.n, {sdy, options_.grads_e5m2(), tensorwise(), options_.margin_factor()}, dy8_, dyt8_,
                 stream);
  }
  ready = 0;
  const auto i = static_cast<std::size_t>(index(l, g)), a = static_cast<std::size_t>(act_slot_);
  if (const fp8* kept = kept_t_[a][i]) {  // the forward's (swiglu_forward)
    xt_ = kept, xt_scale_inv_ = &x_slots_[a][i].scale_inv;
    return;
  }
  // x^T [k, rows] with the scale x was cast with in the forward (tensorwise: its activation slot's; its amax, max-ed
  // in again, is unchanged) or the slot's scale as it stands (delayed).
  fp8_quantize(x, rows, w.k, {sx, false, false, options_.margin_factor()}, nullptr, xq_, stream);
  xt_ = xq_, xt_scale_inv_ = &sx->scale_inv;
}

void Fp8Linears::backward_weight(Gemm& gemm, int l, Linear g, int rows, float* dw, float beta, cudaStream_t stream) {
  const Weight& w = weight(l, g);
  // K: the rows padded to 16, over which the transposed operands' zero pad adds nothing (fp8_padded_rows).
  const auto k = static_cast<int>(fp8_padded_rows(rows));
  gemm.run_fp8(w.n, w.k, k, {dyt8_, k, options_.grads_e5m2(), &slot(l, g, kDy)->scale_inv},
               {xt_, k, false, xt_scale_inv_}, dw, true, w.k, beta, false, stream);
}

void Fp8Linears::backward_data(Gemm& gemm, int l, Linear g, int rows, bf16* dx, cudaStream_t stream) {
  const Weight& w = weight(l, g);
  gemm.run_fp8(rows, w.k, w.n, {dy8_, w.n, options_.grads_e5m2(), &slot(l, g, kDy)->scale_inv},
               {w.wt8, w.n, false, &slot(l, g, kW)->scale_inv}, dx, false, w.k, 0.0f, false, stream);
}

}  // namespace dlm::train::cuda
