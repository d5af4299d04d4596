// FP8 operands on the device: per-tensor scaling slots, the saturating casts that fill them (computing amax in
// the same pass), and the delayed-scaling update. The scale arithmetic is dlm/train/fp8.h's.
//   cast:  q = fp8(x * scale), saturating: |x * scale| beyond the format's max (an outlier, an infinity) becomes
//          +-max, never Inf; NaN stays NaN (a diverged value is not hidden). The GEMM multiplies by scale_inv.
// A slot's scale_inv is written by the cast that used the scale (its first block), so the GEMM that follows a
// cast on the stream reads the inverse of exactly the scale its operand was cast with, whatever update runs later.
#pragma once

#include <cstdint>

#include "dlm/train/fp8.h"
#include "kernels.h"

namespace dlm::train::cuda {

using fp8 = std::uint8_t;  // one e4m3 or e5m2 value, as cuBLASLt reads it

// One FP8 tensor's scaling state (16 bytes, device memory). fp8_max: the format's largest value (448 or 57344).
// scale_inv comes first and the slot is 16-byte aligned: cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED) a scale
// pointer that is not 16-byte aligned.
struct alignas(16) Fp8Slot {
  float scale_inv, amax, scale, fp8_max;
};

// How one tensor is cast. current: tensorwise (the scale is derived from slot->amax, the tensor's own amax, which
// fp8_amax or a fused producer wrote; the scale is stored too); otherwise delayed (slot->scale is used as it is and
// the tensor's amax is max-ed into slot->amax for the next update).
struct Fp8Cast {
  Fp8Slot* slot;
  bool e5m2;
  bool current;
  float margin_factor;  // 2^-margin
};

// slot->amax = max(slot->amax, max |x|) over n elements (NaN ignored). Zero slot->amax first for one tensor's own.
void fp8_amax(const bf16* x, std::int64_t n, Fp8Slot* slot, cudaStream_t stream);
// x [rows, cols] (row-major, leading dimension cols) cast into out [rows, cols] and/or out_t [cols, Tp] (its
// transpose, Tp = fp8_padded_rows(rows), columns [rows, Tp) zero; either may be null). Any rows; cols % 8 == 0.
void fp8_quantize(const bf16* x, int rows, int cols, const Fp8Cast& cast, fp8* out, fp8* out_t, cudaStream_t stream);
// The delayed update of `count` slots, history [count, len] (most recent first): the interval's amax is pushed into
// the window (the oldest leaves), the amax taken by algorithm (max of the window, or the most recent), the scale
// derived from it (fp8_scale), slot->amax zeroed. scale_inv is left to the next cast.
void fp8_update_delayed(Fp8Slot* slots, float* history, int count, int len, bool algo_max, float margin_factor,
                        cudaStream_t stream);
// out[i] = float(q[i]) * slot->scale_inv: the values a GEMM sees (tests).
void fp8_dequantize(const fp8* q, std::int64_t n, bool e5m2, const Fp8Slot* slot, float* out, cudaStream_t stream);

// swiglu.cu: max |h| (|dgu|) over the bf16 values swiglu_forward (swiglu_backward, kernels.h) would write, max-ed
// into slot->amax, nothing written: tensorwise, the amax of the casts below. Any rows, ffn % 8 == 0.
void swiglu_forward_amax(const bf16* gu, int rows, int ffn, Fp8Slot* slot, cudaStream_t stream);
void swiglu_backward_amax(const bf16* dh, const bf16* gu, int rows, int ffn, Fp8Slot* slot, cudaStream_t stream);
// swiglu_forward straight into FP8 with `cast` (as fp8_quantize casts: delayed with the scale as it stands, amax
// recorded; tensorwise from slot->amax, which swiglu_forward_amax wrote), h [rows, ffn] into out and its transpose
// into out_t [ffn, Tp] (fp8_quantize's layouts, the pad zero), no bf16 h: the same bytes as swiglu_forward then
// fp8_quantize. Any rows, ffn % 16 == 0.
void swiglu_forward_fp8(const bf16* gu, int rows, int ffn, const Fp8Cast& cast, fp8* out, fp8* out_t,
                        cudaStream_t stream);
// swiglu_backward straight into FP8 with `cast` (as above; tensorwise after swiglu_backward_amax), dgu [rows, 2 ffn]
// into out and its transpose into out_t [2 ffn, Tp] (the pad zero), no bf16 dgu: the same bytes as swiglu_backward
// then fp8_quantize. Any rows, ffn % 16 == 0.
void swiglu_backward_fp8(const bf16* dh, const bf16* gu, int rows, int ffn, const Fp8Cast& cast, fp8* out,
                         fp8* out_t, cudaStream_t stream);

// A fused cast in a kernel that produces a GEMM operand (rmsnorm_forward, swiglu_forward, window_attention): with
// `out` null only the output's amax is max-ed into slot->amax (tensorwise: a fp8_quantize follows); with `out` set
// the output is also cast with slot->scale as it is (delayed) into out, of the producer's output layout, and
// slot->scale_inv set to its inverse. amax false (with `out` set): the cast alone, the slot left as it is (its
// scale_inv already the scale's inverse: a KV-cache window's stored scales, Fp8Linears).
struct Fp8Out {
  fp8* out;
  Fp8Slot* slot;
  bool e5m2;
  bool amax = true;
};

}  // namespace dlm::train::cuda
