// The CUDA backend's kernels: one op per .cu file beside this header, forward and backward together,
// each launched on a caller's stream. C++17 and plain pointers, so that nvcc (C++17 here) and the
// C++20 model code share it. Row-major throughout; bf16 activations, fp32 norm weights, fp32 gradients
// of weights. Launchers check nothing themselves: the caller checks cudaGetLastError() (check_cuda).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda_check.h"

namespace dlm::train::cuda {

using bf16 = __nv_bfloat16;
struct Fp8Out;   // fp8_cast.h: a cast fused into a producer of a GEMM operand
struct Fp8Slot;  // fp8_cast.h: one FP8 tensor's scaling state

// The current device's multiprocessor count: grids sized as blocks a multiprocessor (tuned on the H100's 132)
// fill any GPU in one wave.
int multiprocessors();

// rmsnorm.cu: fused residual add + RMSNorm.
//   forward: s = x + add (add may be null: s = x); y = s * rstd * w, rstd = 1 / sqrt(mean(s^2) + eps).
//   s_out receives s (may alias x when add is null it is not written).
//   fp8 (may be null): y is also cast to FP8 (fp8_cast.h, Fp8Out).
void rmsnorm_forward(const bf16* x, const bf16* add, bf16* s_out, const float* w, bf16* y, float* rstd,
                     int rows, int dim, float eps, cudaStream_t stream, const Fp8Out* fp8 = nullptr);
//   backward: with g = dy * w and xh = s * rstd, ds = rstd * (g - xh * mean(g * xh));
//   dres = bf16(dres + ds) when `accumulate`, else bf16(ds) (dres is not read): the residual stream's gradient,
//   carried in bf16 as Megatron carries it (the sum in fp32, rounded once per norm), and the next GEMMs' input;
//   dw += sum_rows dy * xh (deterministic: per-block partials, then a fixed-order sum). `partial` holds
//   rmsnorm_partial_floats(rows, dim) floats.
//   dres_amax (may be null): max |dres| over the bf16 values written is max-ed into dres_amax->amax (fp8_amax's
//   value: the tensorwise FP8 cast of dres that follows needs no amax pass of its own).
void rmsnorm_backward(const bf16* dy, const bf16* s, const float* w, const float* rstd, bf16* dres, bool accumulate,
                      float* dw, float* partial, int rows, int dim, cudaStream_t stream, Fp8Slot* dres_amax = nullptr);
std::int64_t rmsnorm_partial_floats(int rows, int dim);

// partial_sums.cu: the fixed-order second pass of the norms' weight gradients (rmsnorm, qk_norm_rope):
//   for j < cols: (j < split ? lo[j] : hi[j - split]) += sum over r in [0, rows) of partial[r * cols + j].
void sum_partial_rows(const float* partial, int rows, int cols, float* lo, float* hi, int split, cudaStream_t stream);

// qk_norm_rope.cu: per-head RMSNorm of q and k (optional) then rotate-half RoPE, reading the fused QKV
// projection's layout [tokens, groups * (heads/groups + 2) * head_dim] (per group: its q heads, k, v) and
// writing the attention layout [tokens, (heads + 2 groups) * head_dim] = [q heads | k groups | v groups],
// which cuDNN reads with uniform strides. v is copied. The backward reads dout in the attention layout and
// writes dqkv in the projection's.
//   q' = rope(norm(q) * qn), k' = rope(norm(k) * kn); rope on pair (i, i + d/2) with angle pos * theta_i:
//   (a, b) -> (a cos - b sin, b cos + a sin). cos/sin: [max_pos, head_dim / 2] tables.
struct QkvShape {
  int tokens, heads, groups, head_dim;
  bool qk_norm;
  float eps;
  // false: v's slots are left alone both ways (the attention reads V from the projection and writes dV there:
  // Attention::reads_v_from_projection); true: v is copied to the attention layout and dv back.
  bool copy_v = true;
};
void qk_norm_rope_forward(const QkvShape& s, const bf16* qkv, bf16* out, float* rstd /*[tokens, heads+groups]*/,
                          const float* qn, const float* kn, const int* positions, const float* cos_table,
                          const float* sin_table, cudaStream_t stream);
//   backward: un-rotate (the transpose of the rotation), then the RMSNorm backward per head; dqn/dkn
//   accumulate (+=) deterministically through `partial` (qk_norm_partial_floats floats).
void qk_norm_rope_backward(const QkvShape& s, const bf16* dout, const bf16* qkv, const float* rstd,
                           const float* qn, const float* kn, const int* positions, const float* cos_table,
                           const float* sin_table, bf16* dqkv, float* dqn, float* dkn, float* partial,
                           cudaStream_t stream);
std::int64_t qk_norm_partial_floats(const QkvShape& s);

// swiglu.cu: gu = [gate | up] per row (the fc1 layout), h = silu(gate) * up.
//   fp8 (may be null): h is also cast to FP8 (fp8_cast.h, Fp8Out).
void swiglu_forward(const bf16* gu, bf16* h, std::int64_t rows, int ffn, cudaStream_t stream,
                    const Fp8Out* fp8 = nullptr);
//   d gate = dh * up * sig(g) * (1 + g (1 - sig(g))), d up = dh * silu(g).
//   dgu_amax (may be null): max |dgu| over the bf16 values written is max-ed into dgu_amax->amax (as rmsnorm_backward's).
void swiglu_backward(const bf16* dh, const bf16* gu, bf16* dgu, std::int64_t rows, int ffn, cudaStream_t stream,
                     Fp8Slot* dgu_amax = nullptr);

// embedding.cu: x[t] = table[ids[t]] (id -1: a zero row, no gradient: another tensor-parallel rank's); backward dtable[id] += sum of dx over the tokens holding id, deterministic
// (no atomics): embedding_plan groups the tokens by id on the host (order: token indices sorted by id,
// stable) and cuts each id's run into segments of at most kEmbeddingSegment tokens; an id of one segment
// adds into its row directly (slot -1), one of several sums its segments into partial rows `slot`, which
// `combine` adds up in order. dim % 4 == 0. Buffers: order [tokens], segments cuda_embedding_segments(tokens),
// combine and partial rows cuda_embedding_slots(tokens) (partial: that many rows of dim floats; both in
// dlm/train/cuda_memory_plan.h, where kCudaEmbeddingSegment is this constant).
constexpr int kEmbeddingSegment = 32;
struct EmbeddingSegment {
  int id, begin, end, slot;
};
struct EmbeddingCombine {
  int id, first_slot, count;
};
void embedding_plan(const int* ids, int tokens, std::vector<int>& order, std::vector<EmbeddingSegment>& segments,
                    std::vector<EmbeddingCombine>& combine);
void embedding_forward(const int* ids, const bf16* table, bf16* x, int tokens, int dim, cudaStream_t stream);
// rows_written (may be null): a flag per table row, set to 1 for every row the backward adds into.
void embedding_backward(const float* dx, const int* order, const EmbeddingSegment* segments, int num_segments,
                        const EmbeddingCombine* combine, int num_combine, float* partial, float* dtable,
                        std::uint8_t* rows_written, int dim, cudaStream_t stream);
// Zeroes the rows of dtable [rows, dim] whose flag is set and clears their flags: with the flags of every
// row written since, the whole table's gradient is zero again.
void clear_written_rows(float* dtable, std::uint8_t* rows_written, std::int64_t rows, int dim, cudaStream_t stream);

// cross_entropy.cu: per row r of bf16 logits [rows, ld] (ld = padded vocabulary, columns >= vocab ignored): loss[r] = w[r] * (lse - x[label]),
// and in place x <- bf16(w[r] * (softmax(x) - onehot(label))), the gradient of sum_r loss[r]. fp32 math, one
// pass for max and sum (online softmax), no fp32 logits stored.
void cross_entropy_forward_backward(bf16* logits, std::int64_t ld, const int* labels, const float* weights,
                                    float* loss, int rows, int vocab, cudaStream_t stream);
// The same over a tensor-parallel rank's columns [first, first + ld) of the padded vocabulary (Megatron's
// vocab-parallel cross-entropy; `vocab` of the columns real, labels global). _local: per row the lse of the
// local columns and the label's logit where it is local (0 elsewhere); the caller gathers lse_local into
// lse_all [group, rows] and sums label_logit over the group; _backward: loss and the in-place gradient with
// lse = logsumexp over the group.
void vocab_parallel_ce_local(const bf16* logits, std::int64_t ld, const int* labels, const float* weights, int first,
                             int vocab, float* lse_local, float* label_logit, int rows, cudaStream_t stream);
void vocab_parallel_ce_backward(bf16* logits, std::int64_t ld, const int* labels, const float* weights, int first,
                                int vocab, const float* lse_all, int group, const float* label_logit, float* loss,
                                int rows, cudaStream_t stream);

// greedy.cu: per row, the argmax over the first `vocab` columns (first on ties) and its softmax probability.
void greedy_tokens(const bf16* logits, std::int64_t ld, int rows, int vocab, int* token, float* confidence,
                   cudaStream_t stream);

// masking.cu: MegaDLMs' difflm-noshift noise drawn on the device with the host's counter-based stream
// (philox.h, objective.h): for row b of clean inputs, t = U(kNoiseLevel, sample_b, 0); masked_j =
// U(kNoiseMask, sample_b, j) < t, one forced position when none; input_j = mask_token where masked;
// weight_j = loss_mask_j * n / count / mask_sum where masked, else 0. Bit-identical to make_model_batch.
void diffusion_noise(const int* clean, const float* loss_mask, const std::uint64_t* sample_index, int batch, int n,
                     std::uint64_t seed, int mask_token, double mask_sum, int* input_ids, float* weights,
                     std::uint8_t* masked, cudaStream_t stream);

// adamw.cu: multi-tensor AdamW over many tensors in one launch, the master weights as their two halves
// (master_split.h: the upper half is the bf16 weight the GEMMs read), fp32 moments (see optimizer.h for the
// update), and the global norm.
struct AdamWTensor {
  bf16* weight;             // the master weights' upper halves
  std::int16_t* weight_lo;  // their lower halves
  float* weight_f32;        // may be null: the new master weights in fp32 as well (the norms read theirs so)
  const float* grad;
  float* m;
  float* v;
  std::int64_t numel;
  float weight_decay;
  // Non-null: the gradient is zero outside the rows (of row_len elements) flagged here, which neither the norm
  // nor AdamW reads (AdamW takes g = 0 there: the same update as reading the zeros).
  const std::uint8_t* rows_written = nullptr;
  std::int64_t row_len = 0;
  // Non-null (with rows_written): the rows no token wrote are not updated now but later, by adamw_catch_up;
  // row_step[r] is the last step applied to row r (AdamW sets it to `step` for the rows it updates).
  int* row_step = nullptr;
};
// The scalars of one AdamW step (adamw_step_scalars: what adamw_step passes its kernel), kept per step for the
// deferred rows.
struct AdamWStepScalars {
  float lr, beta1, beta2, eps, step_size, bc2_sqrt, weight_decay;
};
AdamWStepScalars adamw_step_scalars(float lr, float beta1, float beta2, float eps, int step, float weight_decay);
// Deferred rows (AdamWTensor::row_step; the embedding under CudaModel::set_sparse_embedding_grad): a row no token
// wrote in a step has g = 0 there, so its update is a function of the step's scalars alone, replayed when the
// row is next read with the same arithmetic in the same order: the same bits as updating it every step.
//   adamw_record_step: *slot = s, on the stream.
//   mark_rows: needed[ids[i]] = 1 (ids < 0 skipped): the rows a forward will read.
//   adamw_catch_up: every row (needed null) or every needed row of t replays steps row_step[r] + 1 .. current
//     from history (step s at s % capacity), then row_step[r] = current and needed[r] = 0.
//   fill_row_step: row_step[r] = step for every row.
void adamw_record_step(AdamWStepScalars* slot, const AdamWStepScalars& s, cudaStream_t stream);
void mark_rows(const int* ids, int n, std::uint8_t* needed, cudaStream_t stream);
void adamw_catch_up(const AdamWTensor& t, std::uint8_t* needed, int current, const AdamWStepScalars* history,
                    int capacity, cudaStream_t stream);
void fill_row_step(int* row_step, std::int64_t rows, int step, cudaStream_t stream);
// The tensors cut into chunks of kAdamWChunk elements (the last of a tensor shorter), one block each; built
// once on the host from the host copy of the tensor list. Tensors must start 16-byte aligned.
constexpr std::int64_t kAdamWChunk = 65536;
struct AdamWChunk {
  int tensor, piece;
};
std::vector<AdamWChunk> adamw_chunks(const AdamWTensor* tensors_host, int count);
// sum of squares of every gradient into *sumsq (double, one slot) in a fixed order (deterministic);
// `partial` holds num_chunks doubles.
void grad_sumsq(const AdamWTensor* tensors_device, const AdamWChunk* chunks, int num_chunks, double* partial,
                double* sumsq, cudaStream_t stream);
// The exact zeros of every gradient in `chunks` into *count (elements of an AdamWTensor's unflagged rows count as
// zeros: they hold zeros, unread).
void count_grad_zeros(const AdamWTensor* tensors_device, const AdamWChunk* chunks, int num_chunks,
                      unsigned long long* count, cudaStream_t stream);
// One step; grads are scaled by min(1, max_norm / (sqrt(sumsq) + 1e-6)) on the fly (max_norm <= 0: 1).
void adamw_step(const AdamWTensor* tensors_device, const AdamWChunk* chunks, int num_chunks, const double* sumsq,
                double max_norm, float lr, float beta1, float beta2, float eps, int step, cudaStream_t stream);

// attention.cu: flash attention (online softmax, fp32 accumulation, mma.sync bf16) reading q, k, v in
// place from the attention layout (see qk_norm_rope), output o [tokens, heads * head_dim] and lse [batch,
// heads, seq]. attention_cudnn.h runs the same through cuDNN where it is there; this is the fallback.
//   o = softmax(q k^T / sqrt(d) [+ causal mask]) v; lse = log sum exp of the scaled scores.
// backward recomputes P from lse: dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO o O)), dQ = dS K / sqrt(d),
// dK = dS^T Q / sqrt(d); written into dqkv in the attention layout. Deterministic (no atomics: one kernel owns
// dK, dV per key block, another dQ per query block). head_dim in {16, 32, 64, 128}.
struct AttentionShape {
  int batch, seq, heads, groups, head_dim;
  bool causal;
};
void attention_forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, cudaStream_t stream);
void attention_backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout, const float* lse,
                        float* delta /*[batch, heads, seq]*/, bf16* dqkv, cudaStream_t stream);

// kv_cache.cu: the samplers' block KV cache (CudaModel's KvCacheUse). kv_store copies every token's K (after QK-norm
// and RoPE, from the attention layout qkv_rot) and V (from the projection's grouped layout qkv_raw) into k, v
// [tokens, groups, head_dim]. window_attention: the window's queries (rows b * width + j of qkv_rot, columns first + j
// of sequence b) over every column of their sequence: the window's own K, V inside [first, first + width), the
// store's ([batch, seq, groups, head_dim]) elsewhere; bidirectional, unmasked, o [batch * width, heads * head_dim].
// `first` is in device memory, read by the kernel: a captured launch serves a window of its width at every position.
// head_dim in {16, 32, 64, 128}. query_warps: the queries of a block in warps of 16 (4, 2 or 1; 0 chooses from the
// shape and the GPU, as CudaModel calls it; tests name each). key_splits: at most this many blocks share a query
// tile's keys (0 chooses: more than 1 only where the query tiles leave multiprocessors idle; at most 8, a thread-block
// cluster that merges their partial results). fp8 (may be null; the projection's FP8 input, as rmsnorm_forward takes
// its Fp8Out): max |o| over the bf16 values written is max-ed into fp8->slot->amax (unless fp8->amax is off), and
// with fp8->out set o is also cast with fp8->slot->scale as it stands into fp8->out ([batch * width, heads *
// head_dim] e4m3); `out` may then be null (the cast alone is written: an FP8 window's projection reads only that).
struct WindowAttentionShape {
  int batch, seq, heads, groups, head_dim;
  int width;
};
void kv_store(const bf16* qkv_rot, const bf16* qkv_raw, int tokens, int heads, int groups, int head_dim, bf16* k,
              bf16* v, cudaStream_t stream);
void window_attention(const WindowAttentionShape& s, const int* first, const bf16* qkv_rot, const bf16* qkv_raw,
                      const bf16* k_store, const bf16* v_store, bf16* out, cudaStream_t stream, int query_warps = 0,
                      int key_splits = 0, const Fp8Out* fp8 = nullptr);

// rows.cu: packed[i] = x[rows[i]] for i < count; and back: x[r] = packed[slot[r]], a zero row where slot[r] < 0
// (every row r < rows written). bf16 rows of dim elements, dim % 8 == 0.
void gather_rows(const bf16* x, const int* rows, int count, int dim, bf16* packed, cudaStream_t stream);
void scatter_rows(const bf16* packed, const int* slot, int rows, int dim, bf16* x, cudaStream_t stream);

// convert.cu
void f32_to_bf16(const float* in, bf16* out, std::int64_t n, cudaStream_t stream);
// master_split.cu: fp32 master weights into their halves (lo may be null: the bf16 upper halves alone) and back.
void split_master(const float* values, bf16* hi, std::int16_t* lo, std::int64_t n, cudaStream_t stream);
void join_master(const bf16* hi, const std::int16_t* lo, float* out, std::int64_t n, cudaStream_t stream);
void bf16_to_f32(const bf16* in, float* out, std::int64_t n, cudaStream_t stream);
void fill_f32(float* p, float value, std::int64_t n, cudaStream_t stream);
// out = bf16(a + b) (fp32 add: a pipeline stage's output residual).
void add_bf16(const bf16* a, const bf16* b, bf16* out, std::int64_t n, cudaStream_t stream);
// *total += sum of x (double, in a fixed order): the loss of a micro-batch, kept on the device.
void accumulate_sum(const float* x, std::int64_t n, double* total, cudaStream_t stream);
// p[i] = std * N(0, 1) from a hash of (seed, i) (Box-Muller): fast device init for benchmarks.
void init_normal(float* p, std::int64_t n, float std, std::uint64_t seed, cudaStream_t stream);
// Model::init's values: N(0, std^2) by Box-Muller over the counter stream (seed, "INIT", tensor, pair).
void init_normal_counter(float* p, std::int64_t n, double std, std::uint64_t seed, std::uint32_t tensor,
                         cudaStream_t stream);

}  // namespace dlm::train::cuda
