// The model a training run trains, for every device and layout, made in one place:
//   --device cpu, one replica:          Model over the CPU backend
//   --device cpu, tensor/pipeline:      this rank's chunks of a ParallelModel (model_parallel.h)
//   --device cuda, one process:         a CudaModel with its optimizer on the GPU (device.h)
//   --device cuda, any parallel layout: this rank's CudaModel shard, its collectives over the device groups,
//                                       with the distributed optimizer or the overlapped reduction its own
// Every variant starts from Model::init(seed)'s weights (a shard: its slice of them), so a run's numbers do
// not depend on the layout beyond the order of fp32 sums (docs/parallelism.md). The tools name a Device and
// the layout's flags, never a backend.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/cuda_options.h"
#include "dlm/train/device.h"
#include "dlm/train/device_groups.h"
#include "dlm/train/parallel.h"
#include "dlm/train/train_checkpoint.h"
#include "dlm/train/trainer.h"

namespace dlm::train {

struct TrainingModelOptions {
  Device device = Device::kCpu;
  std::uint64_t seed = 0;     // the weights' init (--seed)
  int threads = 0;            // the CPU backend's threads (--threads; 0: all cores)
  // false when a checkpoint's weights are loaded next: the CPU models then skip their init (a CudaModel
  // always draws it when made).
  bool init_weights = true;
  // The layout. No groups: the whole model on one process.
  ProcessGroups* groups = nullptr;
  DeviceGroups* device_groups = nullptr;   // --device cuda with groups: the model's groups over device memory
  bool sequence_parallel = false;          // --sequence-parallel
  int layers_per_virtual_stage = 0;        // --num-layers-per-virtual-pipeline-stage (0: not interleaved)
  bool distributed_optimizer = false;      // --use-distributed-optimizer (the GPU model's own with DP > 1)
  bool overlap_grad_reduce = false;        // --overlap-grad-reduce (the GPU model's own with DP > 1)
  std::int64_t ddp_bucket_size = 40'000'000;  // --ddp-bucket-size
  bool recompute_layers = false;           // --recompute-granularity full (GPU)
  CudaOptions cuda;                        // the CUDA backend's choices (--deterministic-mode, --cuda-attention ...)
};

struct TrainingModel {
  std::unique_ptr<TrainableModel> model;
  // Under tensor/pipeline parallelism: where this rank's shards sit in a checkpoint.
  std::optional<CheckpointPlacement> placement;
  // The backend and model behind `model`: must outlive it.
  std::shared_ptr<void> keep_alive;
};

// dlm::Error of one line for a device that is not there, a GPU layout without its device groups, or a shape or
// layout the backend cannot run.
TrainingModel make_training_model(const ckpt::ModelConfig& config, const TrainingModelOptions& options);

}  // namespace dlm::train
