// When a training run saves a checkpoint, what it writes and which ranks write it: the save policy, in one place.
//
// When (SaveSchedule, which Trainer::run asks after every iteration): after each --save-interval-th iteration;
// after each iteration listed by --checkpoint-steps;
// after the iteration on which the ranks agreed to stop (SIGINT/SIGTERM on any rank, --exit-interval); after the
// last iteration (--train-iters); and, before the run fails on a non-finite loss or gradient norm, the weights
// from before that step (the last good state), unless that iteration was saved already. After each
// --non-persistent-save-interval-th iteration where none of those is due, a non-persistent one (below).
//
// What (CheckpointSaver, the SaveFn dlm-train hands the trainer): the weights, the whole AdamW state, the
// progress (iteration, consumed samples, optimizer steps) and the run's flags as metadata, in libckpt's native
// format (train_checkpoint.h): written under a temporary name and committed atomically, so the tracker
// ROOT/latest always names the newest complete checkpoint. After each commit, world rank 0 also replaces
// Megatron's tracker ROOT/latest_checkpointed_iteration.txt (the iteration in decimal, as Megatron writes it;
// temp + fsync + rename) for the scripts that read it; it never names an iteration `latest` does not.
//
// Who: on one process it writes everything. Data-parallel replicas hold the same weights and (gathered) moments:
// rank 0 writes and the others wait at a barrier for the commit, so no rank runs ahead of a save that may still
// fail. Under tensor/pipeline parallelism every rank takes part and data-parallel rank 0 of each position writes
// that position's shards; world rank 0 commits once all are written.
//
// --async-save (CheckpointTarget::async): at the save point each writing rank takes a snapshot of its state and
// returns. A GPU model's snapshot (DeviceTraining::begin_snapshot) is the device->host copies enqueued into pinned
// buffers kept across saves: the training thread only enqueues them, the background thread waits for them and
// writes from those buffers; the device holds the next AdamW step until they are done. A host model's state (or a
// GPU one under the distributed optimizer: parameters() and optimizer_state(), collectives) is copied into reusable
// host buffers (HostSnapshot) on the training thread. A background thread writes the shards, fsyncs and, on world
// rank 0, commits once every rank's shard file is in place (their checksum files in the temp folder: the rendezvous
// needs no collective off the main thread), then replaces `latest` and Megatron's tracker. The next save point, and wait() at the end of the run, first wait for
// it; a failure on any rank fails every rank there (a collective), never lost. A crash or SIGKILL during the
// background write leaves `latest` naming the previous checkpoint (the same commit protocol).
//
// Non-persistent checkpoints (Megatron's --non-persistent-save-interval with --non-persistent-ckpt-type global):
// save_non_persistent() writes the same checkpoint into CheckpointTarget::non_persistent_dir, then removes the
// older iter_* folders there, keeping only the newest; --load takes the newer of the two
// (train_checkpoint.h: newest_checkpoint_root).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/communicator.h"
#include "dlm/train/train_checkpoint.h"
#include "dlm/train/trainer.h"

namespace dlm::train {

// Megatron's tracker file, beside dlm's `latest`.
inline constexpr const char* kMegatronTracker = "latest_checkpointed_iteration.txt";

class SaveSchedule {
 public:
  // --save-interval (0: no periodic saves), --train-iters, --checkpoint-steps (iterations after which to save) and
  // --non-persistent-save-interval (0: none).
  SaveSchedule(std::int64_t save_interval, std::int64_t train_iters, std::set<std::int64_t> steps = {},
               std::int64_t non_persistent_interval = 0)
      : interval_(save_interval), train_iters_(train_iters), steps_(std::move(steps)),
        non_persistent_(non_persistent_interval) {}
  // After `iteration` iterations (1-based), `stopping` when the ranks agreed to stop after it.
  bool due(std::int64_t iteration, bool stopping) const {
    return (interval_ > 0 && iteration % interval_ == 0) || stopping || iteration == train_iters_ ||
           steps_.count(iteration) > 0;
  }
  // Before failing on a non-finite step taken after `iteration` iterations: its weights are still those of
  // `iteration`.
  bool due_before_failing(std::int64_t iteration) const { return last_saved_ != iteration; }
  // A non-persistent save after `iteration`, where no persistent one is due (Megatron's order).
  bool non_persistent_due(std::int64_t iteration, bool stopping) const {
    return non_persistent_ > 0 && iteration % non_persistent_ == 0 && !due(iteration, stopping);
  }
  void saved(std::int64_t iteration) { last_saved_ = iteration; }

 private:
  std::int64_t interval_, train_iters_;
  std::set<std::int64_t> steps_;
  std::int64_t non_persistent_;
  std::int64_t last_saved_ = -1;
};

struct CheckpointTarget {
  std::string dir;                                 // --save
  ckpt::ModelConfig config;                        // the model's, written to metadata.json
  std::map<std::string, std::string> metadata;     // the run's flags, kept beside the training state
  std::optional<CheckpointPlacement> placement;    // tensor/pipeline parallelism: this rank's shards
  Communicator* world = nullptr;                   // several ranks: all of them (null: one process)
  bool data_parallel_rank_zero = true;             // with a placement: this rank writes its position's shards
  bool async = false;                              // --async-save: write in the background (above)
  std::string non_persistent_dir;                  // where save_non_persistent() writes ("": --save/non_persistent)
  // Called with --async-save on the thread that writes this rank's shards, once the state is in host memory and
  // before the first byte is written (tests observe there that the save point returned without the write).
  std::function<void()> before_write;
};

class CheckpointSaver {
 public:
  explicit CheckpointSaver(CheckpointTarget target);
  // A SaveFn: collective over target.world when there is one (every rank calls it at the same save point).
  void operator()(const TrainProgress& progress, TrainableModel& model, const AdamW& optimizer) const;
  // The same, as a non-persistent checkpoint (above).
  void save_non_persistent(const TrainProgress& progress, TrainableModel& model, const AdamW& optimizer) const;
  // Waits for a background save in flight; collective like a save. Throws when it failed on any rank.
  void wait() const;
  // Allocates, on a rank that writes, the host memory a GPU model's saves copy its state into (pinned: slow to
  // allocate), so that the first save point does not pay for it. dlm-train calls it at start-up.
  void reserve(TrainableModel& model) const;
  // Megatron's default folder of the non-persistent checkpoints of `save_dir`.
  static std::string default_non_persistent_dir(const std::string& save_dir);

 private:
  struct Background;
  void save(const std::string& dir, bool non_persistent, const TrainProgress& progress, TrainableModel& model,
            const AdamW& optimizer) const;
  bool writes() const;  // this rank writes shards (above: Who)
  CheckpointTarget target_;
  std::shared_ptr<Background> background_;  // shared by the copies a SaveFn makes; the last one joins its thread
};

}  // namespace dlm::train
