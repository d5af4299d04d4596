// CheckpointSaver (checkpoint_saver.h): which ranks write a checkpoint, with what, and when it is committed.
#include "dlm/train/checkpoint_saver.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "host_snapshot.h"

namespace dlm::train {
namespace fs = std::filesystem;
namespace {

void write_megatron_tracker(const std::string& dir, std::int64_t iteration) {
  write_file_atomically((fs::path(dir) / kMegatronTracker).string(), std::to_string(iteration));
}

// After a non-persistent commit: only the newest checkpoint stays (Megatron keeps one).
void remove_older_checkpoints(const std::string& root, std::int64_t newest) {
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !name.starts_with("iter_") || name.ends_with(".tmp")) continue;
    std::int64_t iteration = -1;
    try {
      iteration = std::stoll(name.substr(5));
    } catch (const std::exception&) {
      continue;
    }
    if (iteration < newest) fs::remove_all(entry.path());
  }
}

// The state's copies in `snapshot`, as views in the same order.
StateViews snapshot_of(const StateViews& live, HostSnapshot& snapshot) {
  std::vector<std::span<const float>> spans;
  for (const auto& p : live.params) spans.emplace_back(p.value);
  spans.insert(spans.end(), live.exp_avg.begin(), live.exp_avg.end());
  spans.insert(spans.end(), live.exp_avg_sq.begin(), live.exp_avg_sq.end());
  const std::vector<std::span<const float>> copies = snapshot.take(spans);
  StateViews s = live;
  const std::size_t n = live.params.size(), m = live.exp_avg.size();
  for (std::size_t i = 0; i < n; ++i) s.params[i].value = {const_cast<float*>(copies[i].data()), copies[i].size()};
  for (std::size_t i = 0; i < m; ++i) {
    s.exp_avg[i] = copies[n + i];
    s.exp_avg_sq[i] = copies[n + m + i];
  }
  return s;
}

// A device snapshot's state, once its copies have landed.
StateViews finished(DeviceSnapshot& snapshot, std::int64_t optimizer_steps) {
  StateViews v;
  snapshot.finish(v.params, v.exp_avg, v.exp_avg_sq);
  v.optimizer_steps = optimizer_steps;
  return v;
}

double bytes_of(const StateViews& v) {
  double bytes = 0;
  for (const auto& p : v.params) bytes += static_cast<double>(p.value.size_bytes()) * (v.exp_avg.empty() ? 1 : 3);
  return bytes;
}

}  // namespace

// The background save in flight. `error` is written by its thread and read after the join.
struct CheckpointSaver::Background {
  HostSnapshot snapshot;
  std::thread thread;
  bool pending = false;  // an async save was started on every rank and not yet waited for
  std::int64_t iteration = -1;
  std::string dir, error;
  // Set when the saver goes away (the run failed): rank 0 then waits for the other ranks' shards a while longer
  // only, since a failed peer may never write its own.
  std::atomic<bool> abandoned{false};
  ~Background() {
    abandoned = true;
    if (thread.joinable()) thread.join();
    if (!error.empty()) log::error("background save of iteration {} to {} failed: {}", iteration, dir, error);
  }
};

CheckpointSaver::CheckpointSaver(CheckpointTarget target)
    : target_(std::move(target)), background_(std::make_shared<Background>()) {
  if (target_.non_persistent_dir.empty()) target_.non_persistent_dir = default_non_persistent_dir(target_.dir);
}

std::string CheckpointSaver::default_non_persistent_dir(const std::string& save_dir) {
  return (fs::path(save_dir) / "non_persistent").string();
}

void CheckpointSaver::operator()(const TrainProgress& progress, TrainableModel& model, const AdamW& optimizer) const {
  save(target_.dir, false, progress, model, optimizer);
}

void CheckpointSaver::save_non_persistent(const TrainProgress& progress, TrainableModel& model,
                                          const AdamW& optimizer) const {
  save(target_.non_persistent_dir, true, progress, model, optimizer);
}

void CheckpointSaver::wait() const {
  Background& b = *background_;
  if (!b.pending) return;
  b.pending = false;
  if (b.thread.joinable()) b.thread.join();
  const std::string error = std::move(b.error);
  b.error.clear();
  std::int32_t failed = error.empty() ? 0 : 1;
  if (target_.world) target_.world->all_reduce(std::span<std::int32_t>(&failed, 1), ReduceOp::kMax);
  if (!error.empty()) fail(fmt::format("background save of iteration {} to {} failed: {}", b.iteration, b.dir, error));
  if (failed) fail(fmt::format("background save of iteration {} to {} failed on another rank", b.iteration, b.dir));
}

bool CheckpointSaver::writes() const {
  const bool rank_zero = !target_.world || target_.world->rank() == 0;
  return target_.placement ? target_.data_parallel_rank_zero : rank_zero;
}

void CheckpointSaver::reserve(TrainableModel& model) const {
  if (DeviceTraining* device = model.device_training(); device && writes()) device->reserve_snapshot();
}

void CheckpointSaver::save(const std::string& dir, bool non_persistent, const TrainProgress& progress,
                           TrainableModel& model, const AdamW& optimizer) const {
  wait();  // a second save waits for the first (and fails here if that one did)
  const CheckpointTarget& t = target_;
  if (t.placement && !t.world) fail("a model-parallel checkpoint needs the world communicator");
  const bool rank_zero = !t.world || t.world->rank() == 0;
  static const CheckpointPlacement whole_model;
  const CheckpointPlacement placement = t.placement ? *t.placement : whole_model;
  // Tensor/pipeline shards: every position's data-parallel rank 0 writes its own. Otherwise rank 0 writes the whole
  // model.
  const bool writes = this->writes();
  // A GPU model's state: copied to host memory behind training's back where it can be (DeviceSnapshot). Else, with
  // the distributed optimizer, its weights and moments gathered from every rank's range when asked for (device.h),
  // a collective every rank takes part in.
  DeviceTraining* device = model.device_training();
  std::unique_ptr<DeviceSnapshot> snapshot;
  if (device && writes) snapshot = device->begin_snapshot();
  const bool collective = t.placement || (device && device->optimizer_shards() > 1);
  std::vector<ParamRef> params;
  const AdamW* whole = &optimizer;  // a device model's SaveFn gets the step count only (trainer.h)
  AdamW device_state(optimizer.options());
  if (!snapshot && (writes || collective)) {
    if (device) device_state = device->optimizer_state(), whole = &device_state;
    params = model.parameters();
  }

  const auto started = std::chrono::steady_clock::now();
  auto writer = std::make_shared<ckpt::CheckpointWriter>(dir, progress.iteration, t.config, placement.layout);
  if (rank_zero) writer->begin();  // before any rank writes
  if (t.world) t.world->barrier();
  const ckpt::TrainingState state = training_state(optimizer.steps(), progress, t.metadata);
  // `bytes`: this rank's, for the log line's rate.
  const auto commit = [writer, state, dir, non_persistent, iteration = progress.iteration, started](double bytes) {
    writer->commit(state);
    write_megatron_tracker(dir, iteration);
    if (non_persistent) remove_older_checkpoints(dir, iteration);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    log::info("saved iteration {} to {}{} ({:.2f} GB in {:.2f} s: {:.2f} GB/s)", iteration, dir,
              non_persistent ? " (non-persistent)" : "", bytes / 1e9, s, bytes / 1e9 / s);
  };
  const bool one_process = !t.world;
  const auto remove_temp = [writer] {
    std::error_code ec;
    fs::remove_all(writer->temp_dir(), ec);
  };

  if (!t.async) {
    double bytes = 0;
    try {  // a failed save (a full disk) leaves no temp folder behind
      if (writes) {
        const StateViews views = snapshot ? finished(*snapshot, optimizer.steps()) : state_views(params, *whole);
        bytes = bytes_of(views);
        write_rank_shards(*writer, t.config, views, placement);
      }
      if (t.world) t.world->barrier();
      if (rank_zero) commit(bytes);
    } catch (...) {
      if (one_process) remove_temp();
      throw;
    }
    if (t.world) t.world->barrier();
    return;
  }

  // Async: the snapshot now, the rest on a thread (checkpoint_saver.h).
  Background& b = *background_;
  b.pending = true;
  b.iteration = progress.iteration;
  b.dir = dir;
  if (!writes && !rank_zero) return;
  // A host model's state changes in place at the next step: it is copied here, on the training thread.
  StateViews copies;
  if (writes && !snapshot) copies = snapshot_of(state_views(params, *whole), b.snapshot);
  params.clear();
  b.thread = std::thread([&b, writer, copies = std::move(copies), snapshot = std::move(snapshot), config = t.config,
                          placement, writes, rank_zero, commit, one_process, remove_temp, steps = optimizer.steps(),
                          before_write = t.before_write] {
    try {
      double bytes = 0;
      if (writes) {
        try {
          const StateViews views = snapshot ? finished(*snapshot, steps) : copies;
          if (before_write) before_write();
          bytes = bytes_of(views);
          write_rank_shards(*writer, config, views, placement);
        } catch (const std::exception& e) {
          if (!rank_zero) {
            try {  // best effort: rank 0 then fails its commit with this message instead of waiting
              for (int stage : placement.stages) writer->report_failure(placement.tensor_rank, stage, user_message(e), placement.expert_rank);
            } catch (const std::exception&) {
            }
          }
          throw;
        }
      }
      if (rank_zero) {
        // The other ranks' shards: their checksum files appear in the temp folder as each finishes.
        auto give_up = std::chrono::steady_clock::time_point::max();
        while (!writer->all_ranks_written()) {
          const auto now = std::chrono::steady_clock::now();
          if (b.abandoned && give_up == std::chrono::steady_clock::time_point::max()) give_up = now + std::chrono::seconds(30);
          if (now > give_up) fail("the run ended before every rank had written its shard");
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        commit(bytes);
      }
    } catch (const std::exception& e) {
      b.error = user_message(e);
      if (one_process) remove_temp();
    }
  });
}

}  // namespace dlm::train
