// dlm-train: trains a masked-diffusion (or AR) language model from dlm-preprocess/dlm-blend data.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "dlm/train/checkpoint_saver.h"
#include "monitoring_flags.h"
#include "parallel_run.h"
#include "pipeline.h"
#include "train_args.h"

namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) { g_stop.store(true); }

// --exit-duration-in-mins: after that wall time since start the run stops as on a signal (the ranks agree on the
// iteration, the checkpoint is saved, exit 0), as Megatron checks after each step.
void stop_after(double minutes) {
  if (minutes <= 0) return;
  std::thread([minutes] {
    std::this_thread::sleep_for(std::chrono::duration<double, std::ratio<60>>(minutes));
    g_stop.store(true);
  }).detach();
}

// The start-up lines of the Megatron flags (train_args.h: TrainArgs::notices), once per job.
void print_notices(const dlm::tools::TrainArgs& args) {
  for (const auto& line : args.notices) dlm::log::info("{}", line);
}

}  // namespace

int main(int argc, char** argv) {
  dlm::tools::TrainArgs args;
  try {
    args = dlm::tools::parse_train_args(argc, argv);
  } catch (const boost::program_options::error& e) {
    fmt::print(stderr, "dlm-train: {}\n(see dlm-train --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dlm-train: {}\n", e.what());
    return 2;
  }
  if (args.help) {
    fmt::print("{}", dlm::tools::train_usage());
    return 0;
  }
  if (args.dry_run) {
    try {
      print_notices(args);
      fmt::print("{}", dlm::tools::dry_run_plan(args));
      return 0;
    } catch (const std::exception& e) {
      fmt::print(stderr, "dlm-train: {}\n", dlm::user_message(e));
      return 1;
    }
  }
  dlm::tools::ParallelRun parallel;
  try {
    parallel = dlm::tools::start_parallel(args, &argc, &argv);
    if (parallel.launch.rank == 0) print_notices(args);
    stop_after(args.exit_duration_minutes);
    // Everything that can be wrong is found here, before a parameter is allocated.
    dlm::tools::TrainingSetup setup = dlm::tools::prepare_on_every_rank(args, parallel);
    dlm::tools::set_job_shape(setup.config, parallel.launch.world_size, args.trainer);
    if (!args.wandb_dir.empty() && parallel.launch.rank == 0) std::filesystem::create_directories(args.wandb_dir);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    dlm::log::info("unigram entropy of the training labels: {:.4f} nats (the loss of a model that ignores its input)",
                   setup.unigram_entropy);
    if (auto* on_device = setup.model->device_training(); on_device && parallel.device_data_parallel())
      dlm::train::run_on_stream(*parallel.device_data_parallel(), on_device->stream());
    dlm::train::Trainer trainer(args.trainer, *setup.model, *setup.train, setup.valid.get(), parallel.data_parallel(),
                                parallel.device_data_parallel());
    trainer.set_test_data(setup.test.get());
    if (setup.resume && setup.resume->optimizer)
      trainer.resume(setup.resume->progress, std::move(*setup.resume->optimizer));
    else if (setup.resume)
      trainer.resume(setup.resume->progress);
    // When and how checkpoints are saved: dlm/train/checkpoint_saver.h.
    std::optional<dlm::train::CheckpointSaver> saver;  // its destructor waits for a background save in flight
    dlm::train::SaveFn save, save_non_persistent;
    if (!args.save.empty()) {
      dlm::train::CheckpointTarget target;
      target.dir = args.save;
      target.config = setup.config;
      target.metadata = dlm::tools::checkpoint_metadata(args);
      target.placement = setup.placement;
      target.world = parallel.world.get();
      // Expert parallelism: each expert-parallel rank of expert-data rank 0 writes its experts.
      target.data_parallel_rank_zero = !parallel.groups || parallel.groups->coords.data < parallel.groups->config.expert;
      target.async = args.async_save;
      target.non_persistent_dir = args.non_persistent_dir;
      saver.emplace(std::move(target));
      saver->reserve(*setup.model);
      save = std::cref(*saver);
      save_non_persistent = [&saver](const auto& progress, auto& model, const auto& optimizer) {
        saver->save_non_persistent(progress, model, optimizer);
      };
    }
    auto stats = trainer.run(save, &g_stop, save_non_persistent);
    if (saver) saver->wait();  // the last checkpoint is committed (or its failure reported) before the exit status
    if (auto* on_device = setup.model->device_training(); on_device && args.cuda.profile && parallel.launch.rank == 0)
      fmt::print(stderr, "{}", on_device->profile_report());
    if (!stats.empty() && parallel.launch.rank == 0)
      fmt::print("dlm-train: {} iterations, final loss {:.4f} (unigram baseline {:.4f})\n", stats.back().iteration,
                 stats.back().loss, setup.unigram_entropy);
    return 0;
  } catch (const std::exception& e) {
    if (!parallel.distributed()) {
      fmt::print(stderr, "dlm-train: {}\n", dlm::user_message(e));
      return 1;
    }
    // The peers may be gone or stuck: MPI_Finalize could wait for them forever, so leave without it
    // (the launcher then ends the other ranks).
    fmt::print(stderr, "dlm-train: rank {}: {}\n", parallel.launch.rank, dlm::user_message(e));
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(1);
  }
}
