// Megatron's fused QKV projection rows, grouped per KV group g (model_config.h):
//   [q of heads g*r .. g*r + r - 1 | k of g | v of g],  r = heads / groups,
// to q [N, H, D], k, v [N, G, D] and back. Pure data movement; backward is the inverse scatter.
#include <cstring>

#include "cpu_backend.h"

namespace dlm::train::cpu {

namespace {

struct QkvShape {
  std::int64_t n, heads, groups, d;
  std::int64_t group_width() const { return (heads / groups + 2) * d; }
};

QkvShape shape_of(const Tensor& q, const Tensor& k) {
  return {q.dim(0), q.dim(1), k.dim(1), q.dim(2)};
}

// Copies between the fused row layout and the split tensors; `to_fused` picks the direction.
void move_qkv(CpuBackend& be, const QkvShape& s, float* fused, float* q, float* k, float* v, bool to_fused) {
  const std::int64_t r = s.heads / s.groups, width = s.groups * s.group_width(), bytes = s.d * sizeof(float);
  be.parallel_for(s.n, 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) {
      for (std::int64_t g = 0; g < s.groups; ++g) {
        float* row = fused + t * width + g * s.group_width();
        for (std::int64_t i = 0; i < r; ++i) {
          float* head = q + (t * s.heads + g * r + i) * s.d;
          to_fused ? std::memcpy(row + i * s.d, head, bytes) : std::memcpy(head, row + i * s.d, bytes);
        }
        float* kh = k + (t * s.groups + g) * s.d;
        float* vh = v + (t * s.groups + g) * s.d;
        to_fused ? std::memcpy(row + r * s.d, kh, bytes) : std::memcpy(kh, row + r * s.d, bytes);
        to_fused ? std::memcpy(row + (r + 1) * s.d, vh, bytes) : std::memcpy(vh, row + (r + 1) * s.d, bytes);
      }
    }
  });
}

void check(const char* op, const QkvShape& s, const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v) {
  expect_numel(op, "qkv", qkv, s.n * s.groups * s.group_width());
  expect_numel(op, "q", q, s.n * s.heads * s.d);
  expect_numel(op, "k", k, s.n * s.groups * s.d);
  expect_numel(op, "v", v, s.n * s.groups * s.d);
}

}  // namespace

void CpuBackend::split_qkv_forward(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v) {
  const QkvShape s = shape_of(q, k);
  check("split_qkv_forward", s, qkv, q, k, v);
  move_qkv(*this, s, f32(qkv), f32(q), f32(k), f32(v), false);
}

void CpuBackend::split_qkv_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dqkv) {
  const QkvShape s = shape_of(dq, dk);
  check("split_qkv_backward", s, dqkv, dq, dk, dv);
  move_qkv(*this, s, f32(dqkv), f32(dq), f32(dk), f32(dv), true);
}

}  // namespace dlm::train::cpu
