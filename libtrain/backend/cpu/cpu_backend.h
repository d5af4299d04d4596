// The CPU backend: fp32 host memory, OpenBLAS for GEMMs and dlm::ThreadPool for everything row-wise.
// One op per file (embedding.cpp, rmsnorm.cpp, ...), forward beside backward; this header only
// declares the class they share.
#pragma once

#include <cstdint>
#include <functional>

#include "dlm/common/thread_pool.h"
#include "dlm/train/backend.h"

namespace dlm::train::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads);
  const char* name() const override { return "cpu"; }

  Tensor alloc(std::vector<std::int64_t> shape, DType dtype) override;
  void copy_from_host(const Tensor& dst, std::span<const float> src) override;
  void copy_from_host(const Tensor& dst, std::span<const std::int32_t> src) override;
  void copy_from_host(const Tensor& dst, std::span<const std::uint8_t> src) override;
  void copy_to_host(const Tensor& src, std::span<float> dst) override;
  std::span<float> host_f32(const Tensor& t) override;
  void zero(const Tensor& t) override;
  void add(const Tensor& y, const Tensor& x) override;
  void copy(const Tensor& dst, const Tensor& src) override;

  void embedding_forward(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dtable) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw) override;
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& y) override;
  void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                       const Tensor& dw) override;
  void split_qkv_forward(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v) override;
  void split_qkv_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dqkv) override;
  void rope_forward(const Tensor& x, const Tensor& positions, double theta, const Tensor& y) override;
  void rope_backward(const Tensor& dy, const Tensor& positions, double theta, const Tensor& dx) override;
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionKind kind,
                         const Tensor& key_valid, const Tensor& out, const Tensor& lse) override;
  void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, AttentionKind kind, const Tensor& key_valid, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv) override;
  void swiglu_forward(const Tensor& gate_up, const Tensor& out) override;
  void swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up) override;
  void moe_experts_forward(const Tensor& x, const Tensor& idx, const Tensor& w, const Tensor& fc1, const Tensor& fc2,
                           const Tensor& out, const Tensor& gate_up, const Tensor& act) override;
  void moe_experts_backward(const Tensor& dout, const Tensor& x, const Tensor& idx, const Tensor& w, const Tensor& fc1,
                            const Tensor& fc2, const Tensor& gate_up, const Tensor& act, const Tensor& dx,
                            const Tensor& dw, const Tensor& dfc1, const Tensor& dfc2) override;
  void cross_entropy_forward(const Tensor& logits, const Tensor& labels, std::int64_t vocab, const Tensor& ce,
                             const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse, const Tensor& weights,
                              std::int64_t vocab, const Tensor& dlogits) override;
  void cross_entropy_backward_shard(const Tensor& logits, const Tensor& labels, std::int64_t first, const Tensor& lse,
                                    const Tensor& weights, std::int64_t vocab, const Tensor& dlogits) override;

  // body(begin, end) over [0, n) on the pool; small n runs inline (thread hand-off costs more).
  void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& body);
  // parallel_for over a body that calls BLAS: OpenBLAS runs single-threaded meanwhile, because its own
  // threads fighting the pool's for the cores spun 85% of a training step away in exec_blas_async.
  void parallel_blas_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& body);

 private:
  ThreadPool pool_;
};

// Typed access for the op files; checks the dtype (a backend bug otherwise, not user input).
float* f32(const Tensor& t);
const std::int32_t* i32(const Tensor& t);
const std::uint8_t* u8(const Tensor& t);
// Checks that a tensor has `numel` elements: "op: name has N elements, expected M".
void expect_numel(const char* op, const char* name, const Tensor& t, std::int64_t numel);

}  // namespace dlm::train::cpu
