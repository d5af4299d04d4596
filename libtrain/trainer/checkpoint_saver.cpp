// CheckpointSaver (checkpoint_saver.h): which ranks write a checkpoint, and with what.
#include "dlm/train/checkpoint_saver.h"

#include <filesystem>
#include <string>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "dlm/common/log.h"

namespace dlm::train {
namespace {

void write_megatron_tracker(const std::string& dir, std::int64_t iteration) {
  write_file_atomically((std::filesystem::path(dir) / kMegatronTracker).string(), std::to_string(iteration));
}

}  // namespace

void CheckpointSaver::operator()(const TrainProgress& progress, TrainableModel& model, const AdamW& optimizer) const {
  const CheckpointTarget& t = target_;
  const bool rank_zero = !t.world || t.world->rank() == 0;
  if (t.placement) {
    // Tensor/pipeline shards: every position's data-parallel rank 0 writes its own, rank 0 commits.
    if (!t.world) fail("a model-parallel checkpoint needs the world communicator");
    save_train_checkpoint_sharded(t.dir, t.config, model.parameters(), optimizer, progress, *t.placement, *t.world,
                                  t.data_parallel_rank_zero, t.metadata);
    if (rank_zero) write_megatron_tracker(t.dir, progress.iteration);
    log::info("saved iteration {} to {}", progress.iteration, t.dir);
    return;
  }
  // A GPU model with the distributed optimizer gathers its weights from every rank's range when asked for its
  // parameters (device.h), a collective: every rank takes part in that, rank 0 alone writes.
  const DeviceTraining* device = model.device_training();
  const bool parameters_collective = device && device->optimizer_shards() > 1;
  if (rank_zero || parameters_collective) {
    const auto params = model.parameters();
    if (rank_zero) {
      save_train_checkpoint(t.dir, t.config, params, optimizer, progress, t.metadata);
      write_megatron_tracker(t.dir, progress.iteration);
    }
  }
  if (rank_zero) log::info("saved iteration {} to {}", progress.iteration, t.dir);
  if (t.world) t.world->barrier();
}

}  // namespace dlm::train
