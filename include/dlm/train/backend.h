// The backend seam: memory and the transformer's ops, forward and backward, behind one interface.
//
// The model (model.h) is written once against Backend and never names one; a backend never names the
// model. A Tensor is a shape and a dtype over memory the backend owns (host memory for the CPU
// backend, device memory for a GPU backend): the model moves data across only with copy_from_host /
// copy_to_host and hands tensors to ops; nothing outside a backend dereferences Tensor::data().
//
// Conventions every op keeps (as llm.c's kernels do):
//   - row-major; "N" rows are tokens (batch * seq flattened), activations [N, features];
//   - parameter gradients ACCUMULATE (+=), so gradient accumulation and tied weights are free;
//     activation gradients are WRITTEN (=); the model adds residual branches with add();
//   - backward ops take what their forward saved (rstd, lse) instead of recomputing statistics;
//   - fp32 math; a tensor may store bf16 where a backend supports it (the CPU backend stores fp32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace dlm::train {

enum class DType { kF32, kBF16, kI32, kU8 };
std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

// Memory owned by a backend; freed by it when the last Tensor over it goes.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual std::size_t bytes() const = 0;
};

// A shape and a dtype over (a part of) a Buffer. Copies share the memory.
class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buffer, std::vector<std::int64_t> shape, DType dtype, std::size_t byte_offset = 0);

  bool defined() const { return buffer_ != nullptr; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t dim(std::size_t i) const { return shape_.at(i); }
  std::size_t rank() const { return shape_.size(); }
  DType dtype() const { return dtype_; }
  std::int64_t numel() const;
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  // The same memory under another shape of the same element count (dlm::Error otherwise).
  Tensor reshape(std::vector<std::int64_t> shape) const;
  // Rows [first, first + count) of dim 0, the same memory (dlm::Error outside the tensor).
  Tensor rows(std::int64_t first, std::int64_t count) const;
  // The backend's address of the first element (host or device): for backends only.
  void* data() const;

 private:
  std::shared_ptr<Buffer> buffer_;
  std::vector<std::int64_t> shape_;
  DType dtype_ = DType::kF32;
  std::size_t offset_ = 0;
};

// A fp32 tensor's elements in its backend's memory, for a communicator that addresses that memory (MPI:
// host, NCCL: device); a dlm::Error for another dtype.
std::span<float> f32_elements(const Tensor& t);

enum class AttentionKind { kBidirectional, kCausal };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- memory ----
  // A new tensor; contents undefined until written (zero() it when needed).
  virtual Tensor alloc(std::vector<std::int64_t> shape, DType dtype = DType::kF32) = 0;
  // Host <-> backend copies of a whole tensor; the span's size must equal numel(). Floats convert to
  // and from the tensor's storage dtype (bf16: round to nearest even).
  virtual void copy_from_host(const Tensor& dst, std::span<const float> src) = 0;
  virtual void copy_from_host(const Tensor& dst, std::span<const std::int32_t> src) = 0;
  virtual void copy_from_host(const Tensor& dst, std::span<const std::uint8_t> src) = 0;
  virtual void copy_to_host(const Tensor& src, std::span<float> dst) = 0;
  // The tensor's memory as host fp32 when the backend's memory is host fp32 (the CPU backend), so a
  // host optimizer can update it in place; an empty span otherwise.
  virtual std::span<float> host_f32(const Tensor& t) = 0;

  // ---- elementwise ----
  virtual void zero(const Tensor& t) = 0;
  // y += x (same numel).
  virtual void add(const Tensor& y, const Tensor& x) = 0;
  // dst = src, bit for bit (same dtype and numel).
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;

  // ---- ops (one file each in a backend, forward beside backward) ----
  // Embedding: out[n] = table[ids[n]].  ids [N] i32, table [V, H], out [N, H].
  // Backward: dtable[ids[n]] += dout[n]. An id of -1 (a row another tensor-parallel rank holds) gives a
  // zero row and no gradient; any other id outside [0, V) is a dlm::Error.
  virtual void embedding_forward(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;
  virtual void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dtable) = 0;

  // RMSNorm over the last dim D of x [R, D]: rstd = 1 / sqrt(mean(x^2) + eps), y = x * rstd * w.
  // Backward: xhat = x * rstd, g = dy * w, dx = rstd * (g - xhat * mean(g * xhat)); dw += sum_r dy * xhat.
  // Used per token (D = hidden) and per head for Qwen3's QK-norm (R = N * heads, D = head_dim).
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) = 0;
  virtual void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                const Tensor& dx, const Tensor& dw) = 0;

  // Linear projection without bias: y [N, M] = x [N, K] * W^T, W [M, K] (torch's nn.Linear layout).
  // Backward: dx = dy * W (written); dW += dy^T * x. dx may be an undefined Tensor (not needed).
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor& y) = 0;
  virtual void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                               const Tensor& dw) = 0;

  // Megatron's fused QKV rows -> separate heads. qkv [N, G * (H/G + 2) * D], per KV group g the rows
  // [q of heads g*H/G .. | k of g | v of g]; q [N, H, D], k and v [N, G, D]. Backward is the inverse
  // scatter (written).
  virtual void split_qkv_forward(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v) = 0;
  virtual void split_qkv_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dqkv) = 0;

  // Rotary embedding as HF Llama/Qwen3 (rotate_half): for head dim D, i < D/2,
  //   f_i = theta^(-2i/D), a = pos * f_i, y_i = x_i cos a - x_{i+D/2} sin a, y_{i+D/2} = x_{i+D/2} cos a + x_i sin a.
  // x [N, heads, D], positions [N] i32. Backward rotates by -a. In place (y == x) is allowed.
  virtual void rope_forward(const Tensor& x, const Tensor& positions, double theta, const Tensor& y) = 0;
  virtual void rope_backward(const Tensor& dy, const Tensor& positions, double theta, const Tensor& dx) = 0;

  // Scaled dot-product attention with grouped KV heads (query head h reads KV head h / (H/G)):
  //   S = q k^T / sqrt(D), masked, P = softmax(S), out = P v; lse [B, H, L] = logsumexp of each row.
  // q, out [B, L, H, D]; k, v [B, L, G, D]. kCausal: key j visible to query i iff j <= i.
  // key_valid [B, L] u8 (optional, undefined = all valid): keys with 0 are never attended (left
  // padding). A query that sees no key outputs 0 (lse = -inf) and gets no gradient.
  // The bidirectional forward also takes fewer queries than keys: q, out [B, Lq, H, D], lse [B, H, Lq]
  // over k, v [B, Lk, G, D], key_valid [B, Lk] (a sampler's window of positions over cached keys).
  // Backward: dP = dout v^T, dS = P (dP - rowsum(dout * out)), dq = dS k / sqrt(D),
  //   dk = dS^T q / sqrt(D), dv = P^T dout (all written; summed over the heads of a group).
  virtual void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionKind kind,
                                 const Tensor& key_valid, const Tensor& out, const Tensor& lse) = 0;
  virtual void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, AttentionKind kind, const Tensor& key_valid,
                                  const Tensor& dq, const Tensor& dk, const Tensor& dv) = 0;

  // SwiGLU on fused rows gate_up [N, 2F] = [gate | up]: out [N, F] = silu(gate) * up, silu(g) = g s(g).
  // Backward: dgate = dout * up * s(g) (1 + g (1 - s(g))), dup = dout * silu(g) (written).
  virtual void swiglu_forward(const Tensor& gate_up, const Tensor& out) = 0;
  virtual void swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up) = 0;

  // Mixture-of-experts SwiGLU experts, dropless (docs/moe.md): token n goes to the k experts idx[n, j] with
  // combine weights w[n, j]:
  //   y[n, j] = (silu(x[n] G_e^T) * x[n] U_e^T) D_e^T,  e = idx[n, j],  fc1[e] = [G_e ; U_e],  fc2[e] = D_e;
  //   out[n] = sum_j w[n, j] y[n, j].
  // x [N, H], idx [N, k] i32 in [0, E), w [N, k]; fc1 [E, 2F, H], fc2 [E, H, F]; out [N, H] written.
  // gate_up [N * k, 2F] and act [N * k, F] are saved for the backward, rows in the backend's own order.
  // Backward: dw[n, j] = dout[n] . y[n, j] and dx (written); dfc1, dfc2 accumulate.
  virtual void moe_experts_forward(const Tensor& x, const Tensor& idx, const Tensor& w, const Tensor& fc1,
                                   const Tensor& fc2, const Tensor& out, const Tensor& gate_up, const Tensor& act) = 0;
  virtual void moe_experts_backward(const Tensor& dout, const Tensor& x, const Tensor& idx, const Tensor& w,
                                    const Tensor& fc1, const Tensor& fc2, const Tensor& gate_up, const Tensor& act,
                                    const Tensor& dx, const Tensor& dw, const Tensor& dfc1, const Tensor& dfc2) = 0;

  // Cross-entropy over the first `vocab` columns of logits [N, Vpad] (the padded columns are sliced
  // away, as Megatron does, and never win): ce[n] = lse[n] - logits[n, label], lse [N] saved.
  // labels [N] i32; a label < 0 is ignored (ce 0). Backward from per-row weights w [N] f32:
  //   dlogits[n, j] = w[n] * (softmax_j - [j == label]) for j < vocab, 0 for padded columns and ignored rows.
  virtual void cross_entropy_forward(const Tensor& logits, const Tensor& labels, std::int64_t vocab,
                                     const Tensor& ce, const Tensor& lse) = 0;
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                      const Tensor& weights, std::int64_t vocab, const Tensor& dlogits) = 0;
  // The same backward on one tensor-parallel rank's columns of the vocabulary (Megatron's
  // VocabParallelCrossEntropy): logits [N, W] are the columns [first, first + W) of the padded
  // vocabulary, `vocab` (<= W) of them real; labels are global ids, lse the whole vocabulary's.
  //   dlogits[n, j] = w[n] (exp(l[n, j] - lse[n]) - [first + j == label[n]]) for j < vocab, 0 beyond;
  //   rows with label < 0: 0. cross_entropy_backward is this with first = 0.
  virtual void cross_entropy_backward_shard(const Tensor& logits, const Tensor& labels, std::int64_t first,
                                            const Tensor& lse, const Tensor& weights, std::int64_t vocab,
                                            const Tensor& dlogits) = 0;

  // Wait for queued work (a no-op on the synchronous CPU backend); copies to host also synchronise.
  virtual void synchronize() {}
};

// The fp32 reference backend: BLAS (OpenBLAS) for GEMMs, a thread pool for the rest.
// threads == 0: all cores.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

}  // namespace dlm::train
