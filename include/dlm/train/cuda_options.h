// What a user or a test may choose about the CUDA backend. Fixed when a CudaModel is made (CudaModel's
// constructor, make_cuda_trainable, make_cuda_sampling); the library reads no environment for these. The
// header needs no CUDA, so the tools fill it from their flags in every build.
#pragma once

#include "dlm/train/fp8.h"

namespace dlm::train {

struct CudaOptions {
  // Bitwise-repeatable steps: cuDNN's deterministic attention backward, and no GEMM autotuning (each GEMM
  // takes cuBLASLt's heuristic choice). Slower. Default: false.
  bool deterministic = false;

  // The attention kernels: cuDNN's fused attention, or dlm's own kernels (attention.cu; the reference the
  // tests hold cuDNN to, and the fallback for a shape cuDNN refuses). Default: kCudnn.
  enum class Attention { kCudnn, kOwn };
  Attention attention = Attention::kCudnn;

  // Sampling forwards captured once per shape and replayed as CUDA graphs. Default: true.
  bool cuda_graphs = true;

  // Times each phase of a step with CUDA events and prints the table (synchronises the stream; no graphs).
  // Default: false.
  bool profile = false;

  // How many optimizer steps the untied embedding's untouched rows may fall behind before every row is brought
  // up to date (the ring of recorded AdamW scalars, CudaModel::set_sparse_embedding_grad). Tests set it small
  // to exercise the wrap. Default: 1024.
  int deferred_embedding_steps = 1024;

  // FP8 linear layers in training (dlm/train/fp8.h: Megatron's --fp8-* flags; libtrain/backend/cuda/fp8_linear.h).
  // Default: off (bf16).
  Fp8Options fp8;

  // The samplers' forwards (forward_logits, greedy_tokens: exact, storing and window forwards; dlm-generate --fp8)
  // with every layer's QKV, projection, fc1 and fc2 GEMMs and the output layer in FP8 e4m3: the weights cast once
  // after they change (an import, an init), each with its own per-tensor scale from its amax; each GEMM's input cast
  // per forward with the scale of its own amax (tensorwise), a KV-cache window's with its store's. The embedding, the
  // norms and attention stay as they are.
  // Independent of `fp8` (training's). dlm::Error for an MoE model or a linear width not a multiple of 16.
  // Default: false (bf16).
  bool fp8_sampling = false;
};

}  // namespace dlm::train
