// make_training_model (training_model.h): the one place that turns a device and a layout into a model.
#include "dlm/train/training_model.h"

#include "dlm/common/error.h"
#include "dlm/train/model.h"
#include "dlm/train/model_adapters.h"
#include "dlm/train/model_parallel.h"

namespace dlm::train {
namespace {

struct CpuModels {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<ParallelModel> parallel;
};

TrainingModel cuda_model(const ckpt::ModelConfig& config, const TrainingModelOptions& o, bool model_parallel,
                         bool gpu_data_parallel) {
  TrainingModel out;
  if (!model_parallel && !gpu_data_parallel) {
    // CudaModel with clipping and AdamW on the GPU, initialised as Model::init(seed) would.
    CudaParallelGroups whole;
    whole.recompute_layers = o.recompute_layers;
    // One replica: nothing but the model writes its gradients (with data parallelism the trainer all-reduces them).
    whole.sparse_embedding_grad = !o.groups || o.groups->config.data == 1;
    out.model = make_cuda_trainable(config, o.seed, whole, o.cuda);
    return out;
  }
  // This rank's CudaModel shard, its layers' collectives and the pipeline's transfers over the device groups,
  // and with the distributed optimizer its range of the optimizer, with --overlap-grad-reduce its own bucketed
  // all-reduce of the gradients (device.h).
  if (!o.device_groups) fail("GPU model parallelism and data parallelism on GPUs need the NCCL groups");
  ProcessGroups& groups = *o.groups;
  const int chunks = virtual_stages_for(config, groups.config.pipeline, o.layers_per_virtual_stage);
  CudaParallelGroups parallel{&groups, o.device_groups->tensor_group.get(), o.device_groups->pipeline_group.get(),
                              o.sequence_parallel, o.device_groups->data_group.get(), o.distributed_optimizer, chunks};
  // Under expert parallelism the gradients are reduced after the backward (dense over DP, experts over expert-DP).
  parallel.overlap_grad_reduce =
      groups.config.data > 1 && o.overlap_grad_reduce && !o.distributed_optimizer && groups.config.expert == 1;
  parallel.expert = o.device_groups->expert_group.get(), parallel.expert_data = o.device_groups->expert_data_group.get();
  parallel.bucket_elements = o.ddp_bucket_size;
  parallel.recompute_layers = o.recompute_layers;
  out.model = make_cuda_trainable(config, o.seed, parallel, o.cuda);
  if (model_parallel) {
    // Chunk v of pipeline rank r is stage v * PP + r of PP x chunks (as the CPU's ParallelModel counts them).
    CheckpointPlacement placement;
    placement.layout.tp = groups.config.tensor;
    placement.layout.pp = groups.config.pipeline * chunks;
    placement.layout.dp = groups.config.data;
    placement.layout.ep = groups.config.expert;
    placement.tensor_rank = groups.coords.tensor;
    placement.expert_rank = expert_rank(groups.config, groups.coords);
    placement.stages.clear();
    for (int v = 0; v < chunks; ++v) placement.stages.push_back(v * groups.config.pipeline + groups.coords.pipeline);
    out.placement = std::move(placement);
  }
  return out;
}

TrainingModel cpu_model(const ckpt::ModelConfig& config, const TrainingModelOptions& o, bool model_parallel) {
  auto owner = std::make_shared<CpuModels>();
  owner->backend = make_cpu_backend(o.threads);
  TrainingModel out;
  if (model_parallel) {
    // This rank's chunks of a TP/PP replica (docs/parallelism.md).
    ModelParallelOptions mp;
    mp.sequence_parallel = o.sequence_parallel;
    mp.virtual_stages = virtual_stages_for(config, o.groups->config.pipeline, o.layers_per_virtual_stage);
    owner->parallel = std::make_unique<ParallelModel>(config, *owner->backend, *o.groups, mp);
    out.model = make_trainable_model(*owner->parallel);
    CheckpointPlacement placement{owner->parallel->layout(), owner->parallel->tensor_rank(), {},
                                  expert_rank(o.groups->config, o.groups->coords)};
    for (std::size_t v = 0; v < owner->parallel->chunks().size(); ++v)
      placement.stages.push_back(owner->parallel->stage_of(v));
    out.placement = std::move(placement);
    if (o.init_weights) owner->parallel->init(o.seed);  // each shard the slice of the same whole-model init
  } else {
    owner->model = std::make_unique<Model>(config, *owner->backend);
    out.model = make_trainable_model(*owner->model);
    if (o.init_weights) owner->model->init(o.seed);
  }
  out.keep_alive = std::move(owner);
  return out;
}

}  // namespace

TrainingModel make_training_model(const ckpt::ModelConfig& config, const TrainingModelOptions& options) {
  const ProcessGroups* g = options.groups;
  const bool model_parallel = g && (g->config.tensor > 1 || g->config.pipeline > 1 || g->config.expert > 1);
  if (options.device == Device::kCpu) return cpu_model(config, options, model_parallel);
  // On GPUs the distributed optimizer and the overlapped reduction over DP > 1 are the model's own work.
  const bool data_parallel = g && g->config.data > 1;
  const bool gpu_data_parallel = data_parallel && (options.distributed_optimizer || options.overlap_grad_reduce);
  return cuda_model(config, options, model_parallel, gpu_data_parallel);
}

}  // namespace dlm::train
