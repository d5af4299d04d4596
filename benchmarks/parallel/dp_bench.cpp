// Data parallelism of dlm's CUDA model over NCCL, one process per GPU (mpirun -np 1 or 2): the same global
// batch on any number of ranks, the gradients summed in buckets of --bucket elements while the backward
// runs (each bucket's all-reduce starts when the layers inside it are done: CudaGradReducer, the trainer's),
// then clipping and AdamW on every rank. Rank 0 prints one JSON line: tokens/s (whole job and per
// GPU), every step's loss, the device memory in use beside dlm-train --dry-run's plan for the layout.
//
// usage: mpirun -np P dp_bench [--config 350m|megadlm-1.7b|tiny] [--global-batch 32] [--steps 10]
//                              [--warmup 3] [--bucket 40000000] [--no-overlap] [--distributed-timeout-minutes 10]
// Rank 0 also writes "step N loss L" to stderr after each step (the kill test waits for them).
// Micro-batch and sequence are the config's (benchmarks/train/cuda_train_bench.cpp's shapes); rank d runs
// the global micro-batches k*P + d of each step (Megatron's order) with weights 1/(G/M), so any P trains the
// same model: the losses of P = 1 and P = 2 agree within bf16 noise.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dlm/train/cuda_grad_reduce.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/device_group.h"
#include "dlm/train/mpi_communicator.h"
#include "dlm/train/nccl_communicator.h"
#include "dlm/train/objective.h"
#include "dlm/train/parallel.h"
#include "dlm/train/parallel_plan.h"

namespace {

using namespace dlm::train;

struct Options {
  std::string config = "350m";
  std::int64_t global_batch = 32, bucket = 40'000'000;
  int steps = 10, warmup = 3;
  bool overlap = true;
  double timeout_minutes = 10;  // --distributed-timeout-minutes
};

dlm::ckpt::ModelConfig model_config(const std::string& name, int& micro_batch, int& seq) {
  dlm::ckpt::ModelConfig c;
  // layers, hidden, heads, groups, head dim, ffn, vocab; seq 2048 (tiny: 32)
  if (name == "350m") c.num_layers = 24, c.hidden_size = 1024, c.num_attention_heads = 16, c.num_query_groups = 8,
                      c.kv_channels = 64, c.ffn_hidden_size = 2816, c.vocab_size = 50304, micro_batch = 8, seq = 2048;
  else if (name == "megadlm-1.7b") c.num_layers = 28, c.hidden_size = 2048, c.num_attention_heads = 16,
                                   c.num_query_groups = 16, c.kv_channels = 128, c.ffn_hidden_size = 6144,
                                   c.vocab_size = 50304, micro_batch = 4, seq = 2048;
  else if (name == "tiny") c.num_layers = 2, c.hidden_size = 64, c.num_attention_heads = 4, c.num_query_groups = 2,
                           c.kv_channels = 16, c.ffn_hidden_size = 176, c.vocab_size = 256, micro_batch = 2, seq = 32;
  else dlm::fail("--config: 350m, megadlm-1.7b or tiny");
  c.max_position_embeddings = seq + 1, c.qk_layernorm = true, c.mask_token_id = static_cast<int>(c.vocab_size - 1);
  return c;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) dlm::fail(a + " needs a value");
      return argv[++i];
    };
    if (a == "--config") o.config = next();
    else if (a == "--global-batch") o.global_batch = std::stoll(next());
    else if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--warmup") o.warmup = std::stoi(next());
    else if (a == "--bucket") o.bucket = std::stoll(next());
    else if (a == "--no-overlap") o.overlap = false;
    else if (a == "--distributed-timeout-minutes") o.timeout_minutes = std::stod(next());
    else dlm::fail("unknown option " + a);
  }
  return o;
}

// One global micro-batch of random tokens, the same on any layout: keyed by step and its global index.
ModelBatch global_micro_batch(const ObjectiveOptions& objective, std::int64_t step, std::int64_t m, int micro, int seq,
                              std::int64_t vocab, std::int64_t num_micro_batches) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(step) * 1'000'003 + static_cast<std::uint64_t>(m));
  SampleBatch b;
  b.batch = micro, b.seq = seq + 1;  // seq + 1 tokens: the un-shifted input has seq positions
  for (std::int64_t i = 0; i < b.batch * b.seq; ++i) {
    b.tokens.push_back(static_cast<int>(rng() % static_cast<std::uint64_t>(vocab - 1)));
    b.labels.push_back(b.tokens.back());
  }
  b.loss_mask.assign(b.tokens.size(), 1.0f);
  for (int k = 0; k < micro; ++k) b.sample_index.push_back(static_cast<std::uint64_t>((step * num_micro_batches + m) * micro + k));
  ModelBatch batch = make_model_batch(objective, b, {step, num_micro_batches, m, true});
  // Megatron averages the micro-batches' losses: 1/(G/M) folded into the weights, as the Trainer does.
  for (float& w : batch.weights) w /= static_cast<float>(num_micro_batches);
  return batch;
}

double gib(double bytes) { return bytes / double(1ull << 30); }

int run(int argc, char** argv, MpiSession& mpi) {
  const Options o = parse(argc, argv);
  int micro = 0, seq = 0;
  const auto config = model_config(o.config, micro, seq);
  auto world = mpi_world_communicator(60 * o.timeout_minutes);
  const int P = world->size(), rank = world->rank();
  if (o.global_batch % (std::int64_t{micro} * P) != 0)
    dlm::fail(fmt::format("--global-batch {} is not a multiple of micro-batch {} x {} ranks", o.global_batch, micro, P));
  const std::int64_t n_global = o.global_batch / micro, n_local = n_global / P;
  auto nccl = nccl_world_communicator(*world, launch_info_from_environment().local_rank, 60 * o.timeout_minutes);
  CudaModel model(config);
  model.init(1);
  // Every replica starts from rank 0's weights (the master weights' bytes broadcast in device memory).
  const auto params = model.parameter_buffer();
  nccl->broadcast(std::span<float>(params.data, static_cast<std::size_t>(params.numel)), 0);
  model.master_weights_written();
  const auto data = nccl_device_group(*nccl);
  CudaGradReducer reducer(model, *data, o.bucket);

  ObjectiveOptions objective;
  objective.mask_token = static_cast<std::int32_t>(config.vocab_size - 1);
  objective.varilen_prob = 0;
  const AdamWOptions adam{0.9, 0.95, 1e-8, 0.1};
  std::vector<double> losses;
  auto step = [&](std::int64_t s) {
    model.zero_grad();
    double loss = 0;
    for (std::int64_t k = 0; k < n_local; ++k) {
      const std::int64_t m = k * P + rank;
      const auto mb = global_micro_batch(objective, s, m, micro, seq, config.vocab_size, n_global);
      const bool last = k + 1 == n_local;
      if (last && P > 1 && o.overlap) reducer.start();
      loss += model.forward_backward({mb.batch, mb.seq, mb.causal, mb.input_ids, mb.labels, mb.position_ids, mb.weights});
    }
    if (P > 1) {
      if (!o.overlap) reducer.start();  // --no-overlap: the whole buffer after the backward, one bucket
      reducer.finish();
      data->complete();
      world->all_reduce(std::span<double>(&loss, 1));
    }
    model.adamw_step(adam, 2e-4, 1.0);
    losses.push_back(loss);
    if (rank == 0) std::fprintf(stderr, "step %lld loss %.6f\n", static_cast<long long>(s), loss);
  };
  for (int s = 0; s < o.warmup; ++s) step(s);
  model.synchronize();
  world->barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < o.steps; ++s) step(o.warmup + s);
  model.synchronize();
  world->barrier();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.steps;

  // Memory: what the model allocated, and the device's use (CUDA context, cuBLAS/cuDNN workspaces, NCCL).
  std::size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  double used[2] = {double(total_bytes - free_bytes), double(model.device_bytes())};
  world->all_reduce(std::span<double>(used, 2), ReduceOp::kMax);
  PlanOptions plan_options;
  plan_options.data = P, plan_options.micro_batch_size = micro, plan_options.global_batch_size = o.global_batch;
  plan_options.seq_length = seq, plan_options.bf16 = true;
  const auto plan = plan_parallel(config, plan_options);
  const auto& stage = plan.stages.front();
  if (rank == 0) {
    const double tokens = double(o.global_batch) * seq / dt;
    std::string loss_list;
    for (double l : losses) loss_list += fmt::format("{}{:.6f}", loss_list.empty() ? "" : ", ", l);
    std::printf(
        "%s\n",
        fmt::format("{{\"peer\": \"dlm\", \"config\": \"{}\", \"gpus\": {}, \"global_batch\": {}, \"micro_batch\": {}, "
                    "\"seq\": {}, \"micro_batches_per_rank\": {}, \"overlap\": {}, \"buckets\": {}, \"step_ms\": {:.2f}, "
                    "\"tokens_per_s\": {:.0f}, \"tokens_per_s_per_gpu\": {:.0f}, \"losses\": [{}], "
                    "\"device_used_gib\": {:.2f}, \"model_gib\": {:.2f}, \"plan_gib\": {:.2f}, \"plan\": {{\"weights\": {:.2f}, "
                    "\"gradients\": {:.2f}, \"optimizer\": {:.2f}, \"activations\": {:.2f}}}, \"attention\": \"{}\"}}",
                    o.config, P, o.global_batch, micro, seq, n_local, P > 1 && o.overlap ? "true" : "false",
                    P > 1 ? reducer.buckets() : 0, dt * 1e3, tokens, tokens / P, loss_list, gib(used[0]), gib(used[1]),
                    gib(stage.memory()), gib(stage.weights), gib(stage.gradients), gib(stage.optimizer),
                    gib(stage.activations), model.attention_engine())
            .c_str());
  }
  nccl.reset();
  (void)mpi;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  try {
    return run(argc, argv, mpi);
  } catch (const CommunicationError& e) {
    std::fprintf(stderr, "dp_bench: %s\n", e.what());
    mpi.abandon();
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp_bench: %s\n", e.what());
    return 1;
  }
}
