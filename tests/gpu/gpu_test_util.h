// Small helpers of the GPU tests: device vectors, bf16 on the host, comparisons.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/backend.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/model.h"

namespace dlm::gpu_test {

// The small model of the parity and model tests: 2 layers, hidden 128, GQA 4/2 heads of 32, QK-norm.
inline ckpt::ModelConfig small_config() {
  ckpt::ModelConfig c;
  c.num_layers = 2, c.hidden_size = 128, c.ffn_hidden_size = 344, c.num_attention_heads = 4;
  c.num_query_groups = 2, c.kv_channels = 32, c.vocab_size = 500, c.max_position_embeddings = 128;
  c.qk_layernorm = true, c.mask_token_id = 499;
  return c;
}

// A whole CudaModel with `options`, initialised from `seed`.
inline std::unique_ptr<train::CudaModel> model_with(const ckpt::ModelConfig& c, const train::CudaOptions& options,
                                                    std::uint64_t seed) {
  auto m = std::make_unique<train::CudaModel>(c, train::CudaShard{}, options);
  m->init(seed);
  return m;
}
inline train::CudaOptions deterministic_options() {
  train::CudaOptions o;
  o.deterministic = true;
  return o;
}
// Bitwise-repeatable steps (cuDNN's deterministic backward, no GEMM tuning): two such models agree bit for bit.
inline std::unique_ptr<train::CudaModel> deterministic_model(const ckpt::ModelConfig& c, std::uint64_t seed) {
  return model_with(c, deterministic_options(), seed);
}
// The choices a step must give the CPU backend's results under: the defaults, the deterministic mode and the
// own attention kernels, by name (for parameterised tests).
struct NamedOptions {
  const char* name;
  train::CudaOptions options;
};
inline std::vector<NamedOptions> step_options() {
  train::CudaOptions own;
  own.attention = train::CudaOptions::Attention::kOwn;
  return {{"Default", {}}, {"Deterministic", deterministic_options()}, {"OwnAttention", own}};
}

// Forward and backward of one micro-batch on the CPU backend's Model (its gradients add up); returns
// sum_i weights_i * CE_i, the loss CudaModel::forward_backward returns.
inline double cpu_forward_backward(train::Model& model, const train::CudaBatch& b) {
  const train::ModelInput in{b.batch, b.seq, b.ids, b.positions, {},
                             b.causal ? train::AttentionKind::kCausal : train::AttentionKind::kBidirectional, {}};
  model.forward(in);
  const auto ce = model.cross_entropy(b.labels);
  double loss = 0;
  for (std::size_t i = 0; i < ce.size(); ++i) loss += double{b.weights[i]} * ce[i];
  model.backward(b.weights);
  return loss;
}

// The fp32 CPU backend's Model with `gpu`'s weights: the reference a CUDA path is held to.
struct CpuReference {
  std::unique_ptr<train::Backend> backend = train::make_cpu_backend(2);
  train::Model model;
  explicit CpuReference(const train::CudaModel& gpu) : model(gpu.config(), *backend) {
    for (const auto& t : gpu.tensors()) model.import_parameter(t.name, gpu.export_parameter(t.name));
  }
  double forward_backward(const train::CudaBatch& b) { return cpu_forward_backward(model, b); }
};

// Token columns in the diffusion objective's shape: labels from [first, first + span), half the positions (by a
// coin per position) masked with `mask` and weighted `weight`, the rest unweighted.
struct MaskedColumns {
  std::vector<std::int32_t> ids, labels;
  std::vector<float> weights;
};
inline MaskedColumns masked_columns(std::mt19937& rng, std::int64_t n, int first, int span, int mask, float weight) {
  MaskedColumns c;
  for (std::int64_t i = 0; i < n; ++i) {
    c.labels.push_back(first + static_cast<std::int32_t>(rng() % static_cast<unsigned>(span)));
    const bool masked = rng() % 2 == 0;
    c.ids.push_back(masked ? mask : c.labels.back());
    c.weights.push_back(masked ? weight : 0.0f);
  }
  return c;
}

// Two micro-batches in flight through the stage calls (slots 0 and 1: both forwards, then both backwards, as
// 1F1B's warm-up runs them); returns their loss.
inline double two_micro_batches_in_flight(train::CudaModel& model, const train::CudaBatch& b0,
                                          const train::CudaBatch& b1) {
  model.reserve_slots(2);
  model.upload_inputs(0, b0), model.upload_inputs(1, b1);
  model.forward_stage(0, 0, true), model.forward_stage(1, 1, true);
  model.backward_stage(0, 0), model.backward_stage(1, 1);
  return model.take_loss();
}

inline bool have_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

template <typename T>
class DeviceVec {
 public:
  explicit DeviceVec(std::size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  explicit DeviceVec(const std::vector<T>& host) : DeviceVec(host.size()) { upload(host); }
  ~DeviceVec() { cudaFree(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* get() const { return p_; }
  void upload(const std::vector<T>& host) { cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> out(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

// Random bf16 values, and the same values back as floats (what the kernel really sees).
inline std::vector<__nv_bfloat16> random_bf16(std::size_t n, std::mt19937& rng, float scale, std::vector<float>& as_float) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<__nv_bfloat16> out(n);
  as_float.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = __float2bfloat16(dist(rng));
    as_float[i] = __bfloat162float(out[i]);
  }
  return out;
}
inline std::vector<float> to_float(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

// ||a - b|| / ||b||
inline double rel_error(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}
inline double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return -2;
    ab += double{a[i]} * b[i], aa += double{a[i]} * a[i], bb += double{b[i]} * b[i];
  }
  return ab / std::sqrt(std::max(aa * bb, 1e-300));
}

// Every parameter's gradient on `gpu` against `cpu`'s: each cosine at least `least` (a failure names `what` and the
// tensor); returns the worst cosine and names its tensor in `worst_name`.
inline double expect_gradients_match(const train::Model& cpu, const train::CudaModel& gpu, const std::string& what,
                                     std::string& worst_name, double least = 0.999) {
  double worst = 1;
  for (const auto& p : cpu.parameters()) {
    const auto g = gpu.export_gradient(p.spec.name), w = cpu.export_gradient(p.spec.name);
    const double cos = cosine(g, w);
    EXPECT_GE(cos, least) << what << ": " << p.spec.name;
    if (cos < worst) worst = cos, worst_name = p.spec.name;
  }
  return worst;
}

}  // namespace dlm::gpu_test
