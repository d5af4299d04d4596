// Attention for the CUDA model: cuDNN's fused flash attention (SDPA forward and backward through the
// cudnn-frontend graph API) where dlm was built with it (DLM_HAVE_CUDNN) and the device's cuDNN takes the
// shape; the own kernels of attention.cu otherwise. Both read q, k, v from the attention layout (kernels.h)
// and write o [tokens, heads * head_dim], lse [batch, heads, seq] and dqkv in the attention layout.
//
// Engine::kOwn (CudaOptions::Attention::kOwn) runs the own kernels always. `deterministic`
// (CudaOptions::deterministic) asks cuDNN for its deterministic backward (its default accumulates dQ with
// atomics); the own kernels are always deterministic.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kernels.h"

namespace dlm::train::cuda {

class Attention {
 public:
  enum class Engine { kAuto, kOwn };
  explicit Attention(Engine engine = Engine::kAuto, bool deterministic = false);
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  void forward(const AttentionShape& s, const bf16* qkv, bf16* o, float* lse, cudaStream_t stream);
  // delta: [batch, heads, seq] scratch for the own kernels.
  void backward(const AttentionShape& s, const bf16* qkv, const bf16* o, const bf16* dout, const float* lse,
                float* delta, bf16* dqkv, cudaStream_t stream);

  // Whether the forms below read V from the QKV projection's own grouped layout (per token, per group: its q
  // heads, k, v) and write dV into the projection's gradient there: then the attention layout's v slots are
  // neither read nor written, and QK-norm + RoPE need not copy v through (QkvShape::copy_v). cuDNN takes V
  // at any stride; the own kernels do not (false).
  bool reads_v_from_projection(const AttentionShape& s);
  void forward(const AttentionShape& s, const bf16* qkv, const bf16* proj, bf16* o, float* lse, cudaStream_t stream);
  void backward(const AttentionShape& s, const bf16* qkv, const bf16* proj, const bf16* o, const bf16* dout,
                const float* lse, float* delta, bf16* dqkv, bf16* dproj, cudaStream_t stream);
  // "cudnn <version>" or "own kernel" (with why, when cuDNN was wanted and not taken), for the last shape.
  std::string engine() const;
  std::size_t workspace_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlm::train::cuda
