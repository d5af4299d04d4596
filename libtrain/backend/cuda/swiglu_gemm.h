// The fc2 backward's data GEMM with SwiGLU's backward in its epilogue (a CUTLASS Hopper kernel):
//   dh = dy W2  [T, F]   (dy [T, d] and W2 [d, F] row-major, bf16, fp32 accumulation)
//   dg = dh * u * sig(g) * (1 + g * (1 - sig(g))),  du = dh * g * sig(g),  with g, u the rows of gu = [gate | up]
// written straight into dgu = [dg | du] ([T, 2F]): dh never reaches memory, and SwiGLU's backward pass
// (read dh and gu, write dgu: 5 bytes an element of gu) is gone. Unlike the unfused pair, dh is not rounded to
// bf16 before the SwiGLU backward uses it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels.h"

namespace dlm::train::cuda {

class SwigluBackwardGemm {
 public:
  SwigluBackwardGemm();
  ~SwigluBackwardGemm();
  SwigluBackwardGemm(const SwigluBackwardGemm&) = delete;
  SwigluBackwardGemm& operator=(const SwigluBackwardGemm&) = delete;

  // Whether this build and device have the kernel (a CUTLASS build, a compute-capability 9.0 GPU).
  bool available() const { return available_; }
  // Enqueues the fused GEMM; false (nothing enqueued) where the kernel cannot take the shape or pointers
  // (16-byte alignment of every row), so the caller runs the GEMM and swiglu_backward instead.
  bool run(const bf16* dy, const bf16* w2, const bf16* gu, bf16* dgu, int tokens, int hidden, int ffn,
           cudaStream_t stream);

 private:
  bool available_ = false;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

}  // namespace dlm::train::cuda
