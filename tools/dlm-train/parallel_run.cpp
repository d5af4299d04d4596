#include "parallel_run.h"

#include <cstdlib>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "dlm/train/batch_plan.h"
#include "dlm/train/device.h"
#include "dlm/train/model_parallel.h"
#include "dlm/train/parallel_plan.h"
#include "dlm/train/pipeline_schedule.h"

namespace dlm::tools {

ParallelRun start_parallel(const TrainArgs& args, int* argc, char*** argv) {
  ParallelRun run;
  run.launch = train::launch_info_from_environment();
  // RANK/WORLD_SIZE without torchrun's agent (an env:// launch of another tool): there is no store dlm can join,
  // and left alone each process would train alone and write the same --save folder.
  if (const char* size = std::getenv("WORLD_SIZE"); run.launch.launcher == "none" && size && std::atoi(size) > 1)
    fail(fmt::format("WORLD_SIZE={} without torchrun (no TORCHELASTIC_RUN_ID): dlm-train takes its ranks from torchrun, "
                     "mpirun or srun; launch `torchrun --nproc_per_node {} dlm-train ...` or `mpirun -np {} dlm-train ...`",
                     size, size, size));
  if (args.world_size > 0 && args.world_size != run.launch.world_size)
    fail(fmt::format("--world-size {}: the launcher ({}) started {} ranks", args.world_size, run.launch.launcher,
                     run.launch.world_size));
  if (args.sequence_parallel && args.tensor_parallel == 1)
    log::warning("--sequence-parallel without tensor parallelism does nothing (as in Megatron)");
  if (args.recompute_full && train::resolve_device(args.device) != train::Device::kCuda)
    log::warning("--recompute-granularity full: the CPU backend keeps every activation");
  if (args.overlap_param_gather)
    log::warning("--overlap-param-gather: the updated weights are all-gathered right after the update, not during "
                 "the next forward (same results)");
  if (args.layers_per_virtual_stage > 0 && args.pipeline_parallel < 2)
    fail("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size of at least 2 (as in Megatron)");
  const int model_ranks = args.tensor_parallel * args.pipeline_parallel;
  if (args.layers_per_virtual_stage > 0 && model_ranks > 0 && run.launch.world_size % model_ranks == 0) {
    // Sizes the plan refuses are the trainer's one-line error later; here only the schedule's own condition.
    const int data = run.launch.world_size / model_ranks;
    const std::int64_t global = args.trainer.global_batch_size, micro = args.trainer.micro_batch_size;
    if (train::BatchPlan::valid(global, micro, data))
      train::check_interleaved_micro_batches(args.pipeline_parallel,
                                             train::BatchPlan(global, micro, data).micro_batches_per_rank());
  }
  if (args.model.num_experts > 0 && args.tensor_parallel > 1 && train::resolve_device(args.device) == train::Device::kCuda)
    fail(fmt::format("--tensor-model-parallel-size {} with --num-experts {}: the CUDA backend runs MoE layers without "
                     "tensor parallelism (the CPU backend has it: --device cpu)", args.tensor_parallel,
                     args.model.num_experts));
  if (args.expert_parallel > 1) {
    if (train::resolve_device(args.device) == train::Device::kCuda && args.trainer.use_distributed_optimizer)
      fail(fmt::format("--expert-model-parallel-size {} with --use-distributed-optimizer: not on the GPU yet (the CPU "
                       "backend has it: --device cpu)", args.expert_parallel));
    if (args.trainer.overlap_grad_reduce)
      log::warning("--overlap-grad-reduce with --expert-model-parallel-size: the gradients are reduced after the "
                   "backward (same results)");
  }
  if (run.launch.world_size == 1 && args.expert_parallel > 1)
    fail(fmt::format("--expert-model-parallel-size {} needs that many data-parallel ranks: launch under mpirun -np N or "
                     "srun", args.expert_parallel));
  if (run.launch.world_size == 1) {
    if (args.tensor_parallel > 1 || args.pipeline_parallel > 1)
      fail(fmt::format("--tensor-model-parallel-size {} x --pipeline-model-parallel-size {} needs that many ranks or a "
                       "multiple: launch under mpirun -np N or srun", args.tensor_parallel, args.pipeline_parallel));
    return run;
  }
  if (run.launch.launcher == "torchrun") {
    auto joined = train::join_torchrun(run.launch, args.timeout_minutes * 60.0);
    run.store = std::move(joined.store);
    run.world = std::move(joined.world);
  } else {
    run.mpi = std::make_unique<train::MpiSession>(argc, argv);
    run.world = train::mpi_world_communicator(args.timeout_minutes * 60.0);
    if (run.world->rank() != run.launch.rank || run.world->size() != run.launch.world_size)
      fail(fmt::format("MPI says rank {} of {}, the launcher ({}) says {} of {}", run.world->rank(), run.world->size(),
                       run.launch.launcher, run.launch.rank, run.launch.world_size));
  }
  log::set_rank(run.launch.rank);
  if (run.launch.rank != 0 && log::level() < log::Level::kWarning) log::set_level(log::Level::kWarning);
  run.groups = train::make_process_groups(*run.world, train::derive_parallel_config(run.launch.world_size, args.tensor_parallel,
                                                                                   args.pipeline_parallel, args.expert_parallel));
  if (train::resolve_device(args.device) == train::Device::kCuda) {
    if (args.trainer.overlap_grad_reduce && args.trainer.use_distributed_optimizer)
      log::warning("--overlap-grad-reduce with --use-distributed-optimizer: on GPUs the gradients are "
                   "reduce-scattered after the backward, not during it (same results)");
    // Before any model exists: this takes the GPU of the local rank. --device-groups staged (tests on one GPU)
    // stages the model's groups through the host instead, every rank on the current GPU.
    if (args.staged_device_groups) {
      log::warning("--device-groups staged: the model's device groups go through host memory (for tests)");
      run.device = train::staged_device_groups(*run.groups);
    } else {
      run.device = train::make_device_groups(*run.world, run.groups->config, run.launch.local_rank,
                                             args.timeout_minutes * 60.0, run.store);
    }
  }
  log::info("{} ranks ({}): TP {} x DP {} x PP {}{}{}{}{}", run.launch.world_size, run.launch.launcher,
            run.groups->config.tensor, run.groups->config.data, run.groups->config.pipeline,
            run.groups->config.expert > 1 ? fmt::format(", EP {} x expert DP {}", run.groups->config.expert,
                                                        run.groups->config.expert_data()) : "",
            args.layers_per_virtual_stage > 0 ? fmt::format(" (interleaved, {} layers per chunk)", args.layers_per_virtual_stage) : "",
            args.sequence_parallel && args.tensor_parallel > 1 ? ", sequence parallel" : "",
            args.trainer.use_distributed_optimizer ? ", distributed optimizer" : "");
  return run;
}

TrainingSetup prepare_on_every_rank(TrainArgs& args, ParallelRun& run) {
  if (!run.distributed()) return prepare_training(args);
  train::ProcessGroups* groups = run.groups ? &*run.groups : nullptr;
  std::uint8_t ok = 0;
  TrainingSetup setup;
  if (run.launch.rank == 0) {
    try {
      setup = prepare_training(args, groups, &run.device);
      ok = 1;
    } catch (...) {
      run.world->broadcast(std::span<std::uint8_t>(&ok, 1), 0);
      throw;
    }
  }
  run.world->broadcast(std::span<std::uint8_t>(&ok, 1), 0);
  if (!ok) fail("rank 0 stopped before training (its error is above)");
  if (run.launch.rank != 0) setup = prepare_training(args, groups, &run.device);
  return setup;
}

std::string dry_run_plan(TrainArgs& args) {
  const ckpt::ModelConfig config = resolve_model(args);
  const int world = args.world_size > 0 ? args.world_size : train::launch_info_from_environment().world_size;
  const auto layout = train::derive_parallel_config(world, args.tensor_parallel, args.pipeline_parallel, args.expert_parallel);
  train::PlanOptions o;
  o.expert = layout.expert;
  o.tensor = layout.tensor;
  o.pipeline = layout.pipeline;
  o.data = layout.data;
  o.sequence_parallel = args.sequence_parallel;
  o.distributed_optimizer = args.trainer.use_distributed_optimizer;
  o.micro_batch_size = args.trainer.micro_batch_size;
  o.global_batch_size = args.trainer.global_batch_size;
  o.seq_length = args.trainer.seq_length;
  o.bf16 = args.bf16;
  o.recompute_full = args.recompute_full;
  // A plan for GPUs is made anywhere (a laptop without CUDA too): --device cuda asks for it; the default
  // plans the device this machine would train on.
  o.cuda_backend = args.device == "cuda" || (args.device.empty() && train::cuda_present());
  o.fp8 = args.cuda.fp8;
  o.virtual_stages = train::virtual_stages_for(config, layout.pipeline, args.layers_per_virtual_stage);
  return train::format_plan(config, train::plan_parallel(config, o));
}

}  // namespace dlm::tools
