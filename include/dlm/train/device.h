// Where a tool's model runs (--device): the CPU backend (Model over the CPU Backend), or one NVIDIA GPU
// through CudaModel (cuda_model.h) with its optimizer on the device. The tools name a Device, never CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/tensor.h"
#include "dlm/train/cuda_options.h"
#include "dlm/train/device_group.h"
#include "dlm/train/parallel.h"
#include "dlm/train/sampler.h"
#include "dlm/train/trainer.h"

namespace dlm::train {

enum class Device { kCpu, kCuda };

// "cpu" | "cuda" | "" (the default: cuda when dlm was built with CUDA and a GPU is present, else cpu).
// "cuda" where there is none, or any other name, is a dlm::Error of one line.
Device resolve_device(const std::string& flag);
std::string_view device_name(Device device);
bool cuda_built();    // this build has the CUDA backend
bool cuda_present();  // ... and a CUDA device is visible

// One rank's part of a parallel run on the GPU (docs/parallelism.md): the MPI groups (host scalars: the
// loss, the gradient norm) and the tensor and pipeline groups over device memory (NCCL; staged through the
// host in tests). Empty: the whole model.
// With distributed_optimizer and host->config.data > 1, the model also does the distributed optimizer's
// data-parallel work over `data`: finish_gradients() reduce-scatters the gradients (each data-parallel rank
// sums its 1/DP range, the trainer then leaves them alone), the norm adds over host->data, step() updates
// the range and all-gathers the updated bf16 weights, and parameters() and optimizer_state() gather the
// fp32 master weights and the moments for checkpoints. As in Megatron, the master weights' remainders and
// AdamW moments (10 bytes per parameter) live on their range's rank only; every rank keeps the bf16 weights and
// fp32 copies of the norm weights (which the forward reads in fp32), summed from their owners each step.
// With overlap_grad_reduce instead (and host->config.data > 1), the model sums its gradients over `data`
// itself (cuda_grad_reduce.h): buckets of bucket_elements all-reduced on a stream of their own as the step's
// last backward finishes their layers (each chunk's last backward under pipelines), the rest in
// finish_gradients(), which waits for all of them; DeviceTraining::reduces_gradients() then tells the trainer
// to leave them alone. The distributed optimizer ignores it: its reduce-scatter follows the backward.
struct CudaParallelGroups {
  ProcessGroups* host = nullptr;
  DeviceGroup* tensor = nullptr;    // with host->config.tensor > 1
  DeviceGroup* pipeline = nullptr;  // with host->config.pipeline > 1
  bool sequence_parallel = false;
  DeviceGroup* data = nullptr;      // with distributed_optimizer or overlap_grad_reduce, and host->config.data > 1
  bool distributed_optimizer = false;
  // Interleaved 1F1B (--num-layers-per-virtual-pipeline-stage): chunks per rank, each a CudaModel of stage
  // v * PP + r; needs host->config.pipeline >= 2 and micro-batches per step a multiple of it.
  int virtual_stages = 1;
  bool overlap_grad_reduce = false;             // --overlap-grad-reduce
  bool recompute_layers = false;                // --recompute-granularity full (CudaModel::set_recompute_layers)
  // Nothing outside the model writes its gradients (one replica, no model parallelism): the untied embedding's
  // gradient is read and cleared only where tokens wrote it (CudaModel::set_sparse_embedding_grad).
  bool sparse_embedding_grad = false;
  std::int64_t bucket_elements = 40'000'000;  // --ddp-bucket-size (Megatron's default)
  // Expert parallelism (host->config.expert > 1): the MoE layers' all-to-alls go through `expert`, and the model
  // sums its gradients itself, the experts' over `expert_data` (with host->config.expert_data() > 1), the rest
  // over `data` (needed then too), as Megatron's separate expert buffers do.
  DeviceGroup* expert = nullptr;
  DeviceGroup* expert_data = nullptr;
};

// A CudaModel of `config` behind the trainer (DeviceTraining: clipping and AdamW on the device), its
// weights Model::init(seed)'s (a shard: its slice of them). Its micro-batches run through the GPU
// pipeline schedule (device_pipeline.h) when `parallel` is given. dlm::Error without the CUDA backend or a
// GPU, or for a shape or layout it cannot run.
std::unique_ptr<TrainableModel> make_cuda_trainable(const ckpt::ModelConfig& config, std::uint64_t seed,
                                                    const CudaParallelGroups& parallel = {},
                                                    const CudaOptions& options = {});

// A CudaModel holding `weights` (every tensor of model_tensors(config), fp32 global shapes) for the
// samplers: logits [rows, len, vocab_size] (the real vocabulary; rows with left padding run without it,
// their pad positions read 0), the greedy fast path (sampler.h's GreedyFn, no logits leave the GPU), and the
// block KV cache's forwards (sampler.h's CachedLogitsModel with its greedy paths; a store per padding group).
struct CudaSampling {
  LogitsFn logits;
  GreedyFn greedy;
  CachedLogitsModel cached;
  std::int64_t vocab = 0;
  std::int64_t parameters = 0;
  std::shared_ptr<void> keep_alive;
};
CudaSampling make_cuda_sampling(const ckpt::ModelConfig& config, const ckpt::TensorSet& weights,
                                const CudaOptions& options = {});
class CudaModel;
// The same around a whole model as it is (the benchmarks' random weights). CUDA builds only.
CudaSampling cuda_sampling(std::shared_ptr<CudaModel> model);

}  // namespace dlm::train
