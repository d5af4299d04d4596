// Training checkpoints on disk, through libckpt: a folder per save, Megatron's layout,
//   <save>/latest_checkpointed_iteration.txt        the iteration of the newest complete checkpoint
//   <save>/iter_0000100/model.safetensors           fp32 weights, dlm's global tensor names
//   <save>/iter_0000100/optimizer.safetensors       exp_avg.<name>, exp_avg_sq.<name> (fp32)
// with the run's state in the safetensors metadata of model.safetensors: "model_config" (dlm's JSON),
// "iteration", "consumed_samples", "adam_steps", and whatever the caller adds (the flags). Every file is
// written atomically and the tracker last, so an interrupted save leaves the previous checkpoint the
// newest complete one. Weights and moments are stored bit for bit: a resume continues the same run.
#pragma once

#include <map>
#include <span>
#include <string>

#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/tensor.h"
#include "dlm/train/optimizer.h"
#include "dlm/train/trainer.h"

namespace dlm::train {

void save_train_checkpoint(const std::string& save_dir, const ckpt::ModelConfig& config,
                           std::span<const ParamRef> params, const AdamW& optimizer, const TrainProgress& progress,
                           const std::map<std::string, std::string>& extra_metadata = {});

struct TrainCheckpoint {
  std::string dir;  // the iter_* folder read
  ckpt::ModelConfig config;
  ckpt::TensorSet weights;
  AdamW optimizer{{}};  // moments in the order of the `params` given to load; options from the caller
  TrainProgress progress;
  std::map<std::string, std::string> metadata;
};

// Reads the newest checkpoint of `load_dir` (its tracker file), or the folder itself when it is an
// iter_* folder. The moments are ordered as `params` (names) and get `adam` as options. Throws
// dlm::Error naming the file and tensor when something is missing or has another shape.
TrainCheckpoint load_train_checkpoint(const std::string& load_dir, std::span<const ParamRef> params,
                                      const AdamWOptions& adam);

// A checkpoint's model against the flags: the first field that differs, as a dlm::Error naming the
// checkpoint file, the field and both values.
void check_config_matches(const ckpt::ModelConfig& flags, const ckpt::ModelConfig& checkpoint, const std::string& file);

// Copies the weights into the parameters (names and sizes must match).
void restore_weights(const TrainCheckpoint& checkpoint, std::span<const ParamRef> params);

}  // namespace dlm::train
