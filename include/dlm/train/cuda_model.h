// CudaModel: the transformer of model.h trained on one NVIDIA GPU, bf16 activations and weights with fp32
// master weights, gradients and AdamW moments, fused kernels (libtrain/backend/cuda/kernels.h) and
// cuBLASLt GEMMs. It computes what Model computes on the CPU backend (the parity test holds it to that),
// but as whole training steps rather than through the per-op Backend seam, because the seam's fp32
// tensors, separate q/k/v and host optimizer would cost the GPU its speed (docs/cuda.md says which seam
// changes would let it sit behind Backend).
//
// Parameters are named and shaped as model_tensors(config) says; host import/export is fp32.
// A step:  loss = forward_backward(batch) (adds into the gradients) ; adamw_step(...) ; zero_grad().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/optimizer.h"

namespace dlm::train {

// One micro-batch on the host, [batch, seq] row-major; weights as the objective makes them (objective.h).
struct CudaBatch {
  std::int64_t batch = 0, seq = 0;
  bool causal = false;
  std::span<const std::int32_t> ids, labels, positions;
  std::span<const float> weights;
};

class CudaModel {
 public:
  // Allocates parameters and optimizer state on the current device; dlm::Error without one.
  explicit CudaModel(ckpt::ModelConfig config);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  static bool device_available();
  const ckpt::ModelConfig& config() const;

  // N(0, init_method_std^2) for matrices, 1 for norms, drawn on the device (not Model::init's stream).
  void init(std::uint64_t seed);
  void import_parameter(std::string_view name, std::span<const float> values);
  std::vector<float> export_parameter(std::string_view name) const;
  std::vector<float> export_gradient(std::string_view name) const;
  std::int64_t parameter_count() const;

  // Forward and backward of sum_i weights_i * CE_i over the real vocabulary; gradients accumulate (+=).
  // Returns the loss (double sum of the per-token terms).
  double forward_backward(const CudaBatch& batch);
  // Forward only: fp32 logits [batch * seq, vocab_size] (bf16 values), for sampling and parity checks.
  // positions may be empty (0..seq-1 per row).
  std::vector<float> forward_logits(std::int64_t batch, std::int64_t seq, bool causal,
                                    std::span<const std::int32_t> ids, std::span<const std::int32_t> positions);
  // Forward only, then per position the most likely token and its probability (fp32 softmax over the real
  // vocabulary): the diffusion samplers' greedy x0 and confidence, with no logits leaving the device.
  void greedy_tokens(std::int64_t batch, std::int64_t seq, bool causal, std::span<const std::int32_t> ids,
                     std::span<const std::int32_t> positions, std::vector<std::int32_t>& tokens,
                     std::vector<float>& confidence);
  void zero_grad();
  // Global-norm clipping (max_norm <= 0: none) then AdamW at lr, all on the device; returns the norm.
  double adamw_step(const AdamWOptions& options, double lr, double max_norm);
  void synchronize() const;
  // Device memory in use by this model (parameters, optimizer, activations), bytes.
  std::size_t device_bytes() const;
  // Which attention ran the last step: "cudnn <version>" or "own kernel (why)".
  std::string attention_engine() const;
  // With DLM_CUDA_PROFILE=1: GPU time per phase (GEMMs, attention, norms...) over the steps since the last
  // report; otherwise a header line only.
  std::string profile_report();

 private:
  // logits set: forward only, logits out; greedy set too: forward only, greedy tokens out and the
  // confidences in *logits.
  double step(const CudaBatch& batch, std::vector<float>* logits, std::vector<std::int32_t>* greedy = nullptr);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlm::train
