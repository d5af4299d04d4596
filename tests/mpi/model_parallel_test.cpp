// Tensor, sequence and pipeline parallelism on 4 ranks (run under mpiexec -n 4): a tiny diffusion model
// trained 20 steps under TP2xDP2 (with and without SP), PP2xDP2, TP2xPP2 and interleaved PP2xDP2 against
// the plain single-process Model (computed on each rank): losses within 1e-5 relative, every rank's
// weight shards within fp32 reduction-order tolerance of the same slices of the single-process weights.
// A checkpoint saved under TP2xPP2 resumes under DP4 and continues the single-process loss curve.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "dlm/train/model.h"
#include "dlm/train/model_adapters.h"
#include "dlm/train/model_parallel.h"
#include "dlm/train/parallel_plan.h"
#include "dlm/train/pipeline_schedule.h"
#include "dlm/train/train_checkpoint.h"
#include "dlm/train/trainer.h"
#include "mpi_test_main.h"
#include "tiny_training.h"

namespace dlm::test {
namespace {

using train::Communicator;

constexpr int kVocab = 64;

ckpt::ModelConfig config(bool tied, bool moe = false, double capacity = 0) {
  // vocab 61 is padded to 64: the last tensor rank holds 3 padded columns
  ckpt::ModelConfig c = tiny_model(4, kVocab - 3, tied);
  if (moe) {  // layers 0 and 2 MoE: 4 experts top-2 of width 16, a shared expert of 8, router losses on
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 16;
    c.moe_shared_expert_intermediate_size = 8;
    c.moe_layer_freq = 2;
    c.moe_aux_loss_coeff = 0.01;
    c.moe_z_loss_coeff = 0.001;
    c.moe_expert_capacity_factor = capacity;
    // Drops by position: the probs policy's near-ties reorder under any layout's rounding (EP2 at TP1 drifts 5e-3).
    c.moe_token_drop_policy = ckpt::MoeDropPolicy::kPosition;
  }
  return c;
}

train::TrainerOptions options(bool distributed_optimizer) {
  return tiny_training_options(distributed_optimizer, kVocab - 4);
}

struct Run {
  std::vector<double> losses;
  ckpt::TensorSet weights;  // single process: global tensors; parallel: this rank's shards by name
  std::vector<ckpt::TensorShard> shards;
  std::size_t overlapped_buckets = 0;
};

Run single_process_run(bool tied, std::int64_t micro_batch, bool moe, double capacity) {
  auto backend = train::make_cpu_backend(1);
  train::Model model(config(tied, moe, capacity), *backend);
  model.init(11);
  auto trainable = train::make_trainable_model(model);
  SyntheticSamples source(kVocab - 4);
  auto o = options(false);
  o.micro_batch_size = micro_batch;
  train::Trainer trainer(o, *trainable, source, nullptr, nullptr);
  Run r;
  for (const auto& s : trainer.run({})) r.losses.push_back(s.loss);
  r.weights = model.export_weights();
  return r;
}

const Run& reference(bool tied, std::int64_t micro_batch = 2, bool moe = false, double capacity = 0) {
  static std::map<std::tuple<bool, std::int64_t, bool, double>, Run> runs;
  const std::tuple key{tied, micro_batch, moe, capacity};
  auto it = runs.find(key);
  if (it == runs.end()) it = runs.emplace(key, single_process_run(tied, micro_batch, moe, capacity)).first;
  return it->second;
}

struct Layout {
  int tp = 1, pp = 1, virtual_stages = 1;
  bool sp = false, distributed_optimizer = false, tied = true, overlap = false;
  std::int64_t micro_batch = 2;
  bool moe = false;  // config(tied, true)'s mixture-of-experts model
  int ep = 1;
  double capacity = 0;  // its --moe-expert-capacity-factor (0: dropless)
  std::string name() const {
    const int dp = 4 / (tp * pp);
    return fmt::format("TP{}xPP{}{}xDP{}{}{}{}", tp, pp, virtual_stages > 1 ? fmt::format("(x{} virtual)", virtual_stages) : "",
                       dp, sp ? " + SP" : "", distributed_optimizer ? " + distributed optimizer" : "", tied ? "" : ", untied") +
           (overlap ? " + overlapped reduction" : "") + (micro_batch != 2 ? fmt::format(", micro-batch {}", micro_batch) : "") +
           (moe ? fmt::format(", MoE EP{}", ep) : "") + (capacity > 0 ? fmt::format(", capacity {}", capacity) : "");
  }
};

Run parallel_run(const Layout& l, const std::string& load = "", const std::string& save = "", std::int64_t exit_at = 0) {
  const ckpt::ModelConfig c = config(l.tied, l.moe, l.capacity);
  train::ProcessGroups groups = train::make_process_groups(mpi_world(), train::derive_parallel_config(4, l.tp, l.pp, l.ep));
  auto backend = train::make_cpu_backend(1);
  train::ParallelModel model(c, *backend, groups, {l.sp, l.virtual_stages, {}});
  model.init(11);
  auto trainable = train::make_trainable_model(model);
  auto o = options(l.distributed_optimizer);
  o.micro_batch_size = l.micro_batch;
  o.exit_interval = exit_at;
  o.overlap_grad_reduce = l.overlap;
  SyntheticSamples source(kVocab - 4);
  train::Trainer trainer(o, *trainable, source, nullptr, groups.data.get());
  train::CheckpointPlacement placement{model.layout(), model.tensor_rank(), {}};
  for (std::size_t v = 0; v < model.chunks().size(); ++v) placement.stages.push_back(model.stage_of(v));
  if (!load.empty()) {
    const auto params = trainable->parameters();
    auto checkpoint = train::load_train_checkpoint(load, params, o.adam, placement);
    train::restore_weights(checkpoint, params);
    trainer.resume(checkpoint.progress, std::move(checkpoint.optimizer));
  }
  train::SaveFn save_fn;
  if (!save.empty())
    save_fn = [&](const train::TrainProgress& progress, train::TrainableModel& m, const train::AdamW& optimizer) {
      train::save_train_checkpoint_sharded(save, c, m.parameters(), optimizer, progress, placement, mpi_world(),
                                           groups.coords.data == 0);
    };
  Run r;
  for (const auto& s : trainer.run(save_fn)) r.losses.push_back(s.loss);
  r.overlapped_buckets = trainer.overlapped_buckets();
  for (auto& chunk : model.chunks()) {
    for (auto& [name, t] : chunk->export_weights()) r.weights.insert_or_assign(name, t);
    for (const auto& p : chunk->parameters()) r.shards.push_back(p.shard);
  }
  return r;
}

// Losses from iteration `from` of the single-process run within 1e-5 relative; each shard within 1e-5
// of the same slice of the single-process weights. Rank 0 prints the worst differences.
void expect_single_process_run(const Run& got, const Layout& l, std::size_t from = 0) {
  const Run& want = reference(l.tied, l.micro_batch, l.moe, l.capacity);
  ASSERT_EQ(got.losses.size(), want.losses.size() - from) << l.name();
  double loss = 0, weight = 0;
  for (std::size_t i = 0; i < got.losses.size(); ++i)
    loss = std::max(loss, std::abs(got.losses[i] - want.losses[from + i]) / std::abs(want.losses[from + i]));
  for (const auto& shard : got.shards) {
    const ckpt::Tensor expected = ckpt::extract_shard(want.weights.at(shard.name), shard);
    const auto a = got.weights.at(shard.name).f32(), b = expected.f32();
    ASSERT_EQ(a.size(), b.size()) << shard.name;
    for (std::size_t i = 0; i < a.size(); ++i) weight = std::max(weight, static_cast<double>(std::abs(a[i] - b[i])));
  }
  std::vector<double> worst = {loss, weight};
  mpi_world().all_reduce(std::span<double>(worst), train::ReduceOp::kMax);
  if (mpi_world().rank() == 0)
    std::printf("%s: max relative loss difference %.3g, max weight difference %.3g\n", l.name().c_str(), worst[0], worst[1]);
  EXPECT_LE(loss, 1e-5) << l.name();
  EXPECT_LE(weight, 1e-5) << l.name();
}

TEST(ModelParallel, Tp2Dp2GivesTheSingleProcessRun) {
  ASSERT_EQ(mpi_world().size(), 4);
  EXPECT_LT(reference(true).losses.back(), reference(true).losses.front());  // it learns
  const Layout l{.tp = 2};
  expect_single_process_run(parallel_run(l), l);
}

TEST(ModelParallel, Tp2Dp2WithSequenceParallelGivesTheSingleProcessRun) {
  const Layout l{.tp = 2, .sp = true, .distributed_optimizer = true};
  expect_single_process_run(parallel_run(l), l);
}

// Micro-batch 1: 15 tokens (seq 16 less the diffusion shift) or a variable-length cut of any length, so
// the token rows do not split over 2 tensor ranks: each row is padded, and the padding changes nothing.
TEST(ModelParallel, SequenceParallelPadsRowsThatDoNotSplit) {
  const Layout l{.tp = 2, .pp = 2, .sp = true, .micro_batch = 1};
  expect_single_process_run(parallel_run(l), l);
  // The MoE router leaves the pad rows out: the router losses, the loads and the capacity (0.5: tokens dropped) are
  // the unpadded batch's.
  for (const Layout& moe : {Layout{.tp = 2, .pp = 2, .sp = true, .micro_batch = 1, .moe = true},
                            Layout{.tp = 2, .sp = true, .micro_batch = 1, .moe = true, .ep = 2},
                            Layout{.tp = 2, .sp = true, .micro_batch = 1, .moe = true, .ep = 2, .capacity = 0.5}})
    expect_single_process_run(parallel_run(moe), moe);
}

// MoE layers under TP (expert tensor parallelism = TP): every shard of the weights after 20 steps, the replicated
// router's and the experts' halves included, is the single process's (within 1e-5), with SP and the distributed
// optimizer, with PP, and with EP2 (its expert groups one tensor rank's ranks).
TEST(ModelParallel, MoeUnderTensorParallelismGivesTheSingleProcessRun) {
  EXPECT_LT(reference(true, 2, true).losses.back(), reference(true, 2, true).losses.front());
  for (const Layout& l : {Layout{.tp = 2, .moe = true}, Layout{.tp = 2, .sp = true, .distributed_optimizer = true, .moe = true},
                          Layout{.tp = 2, .pp = 2, .sp = true, .moe = true}, Layout{.tp = 2, .moe = true, .ep = 2},
                          Layout{.tp = 2, .sp = true, .distributed_optimizer = true, .moe = true, .ep = 2}})
    expect_single_process_run(parallel_run(l), l);
}

TEST(ModelParallel, Pp2Dp2GivesTheSingleProcessRun) {
  const Layout l{.pp = 2};
  expect_single_process_run(parallel_run(l), l);
}

TEST(ModelParallel, Tp2Pp2GivesTheSingleProcessRun) {
  const Layout tied{.tp = 2, .pp = 2, .sp = true};
  expect_single_process_run(parallel_run(tied), tied);
  const Layout untied{.tp = 2, .pp = 2, .tied = false};
  expect_single_process_run(parallel_run(untied), untied);
}

TEST(ModelParallel, InterleavedPp2Dp2GivesTheSingleProcessRun) {
  const Layout l{.pp = 2, .virtual_stages = 2, .distributed_optimizer = true};
  expect_single_process_run(parallel_run(l), l);
}

// --overlap-grad-reduce starts bucket reductions inside the last backward (buckets of 1,500 elements:
// several per layer) and changes nothing else.
TEST(ModelParallel, OverlappedGradientReductionGivesTheSameRun) {
  for (const Layout& l : {Layout{.overlap = true}, Layout{.tp = 2, .sp = true, .distributed_optimizer = true, .overlap = true},
                          Layout{.pp = 2, .virtual_stages = 2, .overlap = true}}) {
    const auto r = parallel_run(l);
    expect_single_process_run(r, l);
    EXPECT_GT(r.overlapped_buckets, 0u) << l.name();
    if (mpi_world().rank() == 0) std::printf("%s: %zu buckets started inside the backward\n", l.name().c_str(), r.overlapped_buckets);
  }
}

// The dry run's per-rank figures are the ones a real run holds: parameter elements of the rank's shards
// and the micro-batches a pipeline chunk keeps in flight (counted by the schedule while it runs).
TEST(ModelParallel, DryRunParametersAndInFlightMicroBatchesAreTheRunsOwn) {
  for (const Layout& l : {Layout{.tp = 2, .pp = 2}, Layout{.pp = 2, .virtual_stages = 2}, Layout{.pp = 4}}) {
    const ckpt::ModelConfig c = config(true);
    train::ProcessGroups groups = train::make_process_groups(mpi_world(), train::derive_parallel_config(4, l.tp, l.pp));
    auto backend = train::make_cpu_backend(1);
    train::ParallelModel model(c, *backend, groups, {l.sp, l.virtual_stages, {}});
    model.init(3);
    train::PlanOptions o;
    o.tensor = l.tp;
    o.pipeline = l.pp;
    o.data = groups.config.data;
    o.virtual_stages = l.virtual_stages;
    o.micro_batch_size = 2;
    o.global_batch_size = 16;
    o.seq_length = 16;
    const auto plan = train::plan_parallel(c, o);
    const auto& stage = plan.stages.at(static_cast<std::size_t>(groups.coords.pipeline));
    std::int64_t held = 0;
    for (const train::Parameter* p : model.parameters()) held += p->value.numel();
    EXPECT_EQ(held, stage.parameters) << l.name();

    SyntheticSamples source(kVocab - 4);
    auto opts = options(false);
    std::vector<train::ModelBatch> batches;
    for (std::int64_t m = groups.coords.data; m < 8; m += groups.config.data) {
      train::Trainer reader(opts, *train::make_trainable_model(model), source, nullptr, nullptr);
      batches.push_back(train::make_model_batch(opts.objective, reader.read_batch(source, static_cast<std::uint64_t>(m * 2)),
                                                {0, 8, m, true}));
    }
    std::vector<train::Model*> chunks;
    for (auto& chunk : model.chunks()) chunks.push_back(chunk.get());
    train::PipelineCounters counters;
    train::pipeline_forward_backward(chunks, *groups.pipeline, batches, &counters);
    EXPECT_EQ(counters.max_in_flight, stage.micro_batches_in_flight) << l.name();
    if (mpi_world().rank() == 0)
      std::printf("%s: rank 0 holds %lld parameters, %d micro-batches in flight (dry run: %lld, %lld)\n", l.name().c_str(),
                  static_cast<long long>(held), counters.max_in_flight, static_cast<long long>(stage.parameters),
                  static_cast<long long>(stage.micro_batches_in_flight));
  }
}

// A folder every rank agrees on (rank 0's pid), removed at the end.
std::string shared_dir(const char* what) {
  std::int64_t pid = mpi_world().rank() == 0 ? ::getpid() : 0;
  mpi_world().broadcast(std::span<std::int64_t>(&pid, 1), 0);
  return (std::filesystem::temp_directory_path() / fmt::format("dlm-mpi-{}-{}", what, pid)).string();
}

TEST(ModelParallel, CheckpointOfTp2Pp2ResumesUnderDp4) {
  const std::string dir = shared_dir("tp2pp2-to-dp4");
  const Layout saver{.tp = 2, .pp = 2}, loader{}, interleaved{.pp = 2, .virtual_stages = 2};
  ASSERT_EQ(parallel_run(saver, "", dir, 10).losses.size(), 10u);
  expect_single_process_run(parallel_run(loader, dir), loader, 10);
  expect_single_process_run(parallel_run(interleaved, dir), interleaved, 10);
  mpi_world().barrier();
  if (mpi_world().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlm::test
