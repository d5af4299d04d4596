// Data parallelism on 4 ranks (run under mpiexec -n 4): a tiny diffusion model trained 20 steps under
// DP4, with and without the distributed optimizer, against the same run on one process (computed on
// each rank); checkpoints saved under DP4 resume under DP1 and the other way round.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "dlm/train/model.h"
#include "dlm/train/model_adapters.h"
#include "dlm/train/train_checkpoint.h"
#include "dlm/train/trainer.h"
#include "mpi_test_main.h"
#include "tiny_training.h"

namespace dlm::test {
namespace {

using train::Communicator;

constexpr int kVocab = 64;

ckpt::ModelConfig tiny_config() { return tiny_model(2, kVocab, true); }

train::TrainerOptions options(bool distributed_optimizer) {
  return tiny_training_options(distributed_optimizer, kVocab - 1);
}

struct TrainedRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
};

// Trains to iteration `until` (stopping early at `exit_at`, with a checkpoint in `save`), from `load`
// when given. dp == nullptr: one process.
TrainedRun train_run(Communicator* dp, bool distributed_optimizer, const std::string& load = "", const std::string& save = "",
              std::int64_t exit_at = 0, bool overlap = false) {
  auto backend = train::make_cpu_backend(1);
  train::Model model(tiny_config(), *backend);
  model.init(11);
  auto trainable = train::make_trainable_model(model);
  auto o = options(distributed_optimizer);
  o.exit_interval = exit_at;
  o.overlap_grad_reduce = overlap;
  SyntheticSamples source(kVocab - 1);
  train::Trainer trainer(o, *trainable, source, nullptr, dp);
  if (!load.empty()) {
    const auto params = trainable->parameters();
    auto checkpoint = train::load_train_checkpoint(load, params, o.adam);
    train::restore_weights(checkpoint, params);
    trainer.resume(checkpoint.progress, std::move(checkpoint.optimizer));
  }
  train::SaveFn save_fn;
  if (!save.empty())
    save_fn = [&](const train::TrainProgress& progress, train::TrainableModel& m, const train::AdamW& optimizer) {
      if (!dp || dp->rank() == 0) train::save_train_checkpoint(save, tiny_config(), m.parameters(), optimizer, progress);
      if (dp) dp->barrier();
    };
  TrainedRun r;
  for (const auto& s : trainer.run(save_fn)) r.losses.push_back(s.loss);
  for (const auto& p : trainable->parameters()) r.weights.emplace_back(p.value.begin(), p.value.end());
  return r;
}

double max_relative_loss_difference(const std::vector<double>& got, const std::vector<double>& want, std::size_t from = 0) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[from + i]) / std::abs(want[from + i]));
  return worst;
}

double max_weight_difference(const TrainedRun& a, const TrainedRun& b) {
  double worst = 0;
  for (std::size_t t = 0; t < a.weights.size(); ++t)
    for (std::size_t i = 0; i < a.weights[t].size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(a.weights[t][i] - b.weights[t][i])));
  return worst;
}

const TrainedRun& single_process() {
  static const TrainedRun r = train_run(nullptr, false);
  return r;
}

// A folder every rank agrees on (rank 0's pid), removed at the end.
std::string shared_dir(const char* what) {
  std::int64_t pid = mpi_world().rank() == 0 ? ::getpid() : 0;
  mpi_world().broadcast(std::span<std::int64_t>(&pid, 1), 0);
  return (std::filesystem::temp_directory_path() / fmt::format("dlm-mpi-{}-{}", what, pid)).string();
}

// The run `got` continues the single-process run from iteration `from`: losses within 1e-5 relative
// and the final weights within fp32 reduction-order tolerance. Rank 0 prints the differences.
void expect_single_process_run(const TrainedRun& got, std::size_t from, const char* what) {
  const TrainedRun& want = single_process();
  ASSERT_EQ(got.losses.size(), want.losses.size() - from);
  const double loss = max_relative_loss_difference(got.losses, want.losses, from), weight = max_weight_difference(got, want);
  if (mpi_world().rank() == 0)
    std::printf("%s: max relative loss difference %.3g, max weight difference %.3g\n", what, loss, weight);
  EXPECT_LE(loss, 1e-5) << what;
  EXPECT_LE(weight, 1e-5) << what;
}

TEST(DataParallel, Dp4GivesTheSingleProcessRun) {
  ASSERT_EQ(mpi_world().size(), 4);
  ASSERT_EQ(single_process().losses.size(), 20u);
  EXPECT_LT(single_process().losses.back(), single_process().losses.front());  // it learns
  expect_single_process_run(train_run(&mpi_world(), false), 0, "DP4");
}

TEST(DataParallel, Dp4WithTheDistributedOptimizerGivesTheSingleProcessRun) {
  expect_single_process_run(train_run(&mpi_world(), true), 0, "DP4 + distributed optimizer");
}

TEST(DataParallel, Dp4WithOverlappedReductionGivesTheSingleProcessRun) {
  expect_single_process_run(train_run(&mpi_world(), false, "", "", 0, true), 0, "DP4 + overlapped reduction");
  expect_single_process_run(train_run(&mpi_world(), true, "", "", 0, true), 0,
                            "DP4 + distributed optimizer + overlapped reduction");
}

TEST(DataParallel, CheckpointOfDp4ResumesUnderDp1) {
  const std::string dir = shared_dir("dp4-to-dp1");
  ASSERT_EQ(train_run(&mpi_world(), true, "", dir, 10).losses.size(), 10u);
  if (mpi_world().rank() == 0) {
    expect_single_process_run(train_run(nullptr, false, dir), 10, "DP4 (distributed optimizer) -> checkpoint -> DP1");
    std::filesystem::remove_all(dir);
  }
  mpi_world().barrier();
}

TEST(DataParallel, CheckpointOfDp1ResumesUnderDp4) {
  const std::string dir = shared_dir("dp1-to-dp4");
  if (mpi_world().rank() == 0) {
    ASSERT_EQ(train_run(nullptr, false, "", dir, 10).losses.size(), 10u);
  }
  mpi_world().barrier();
  expect_single_process_run(train_run(&mpi_world(), false, dir), 10, "DP1 -> checkpoint -> DP4");
  expect_single_process_run(train_run(&mpi_world(), true, dir), 10, "DP1 -> checkpoint -> DP4 + distributed optimizer");
  mpi_world().barrier();
  if (mpi_world().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlm::test
