// What dlm-train wires together, each piece from the library that owns it: the model (libtrain's
// model over a backend), the sample sources (libdata's GPTDataset/BlendedDataset reader over the
// --data-path/--split indices), the checkpoint (libckpt's native store) and the tokenizer (libdata).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "dlm/ckpt/model_config.h"
#include "dlm/data/tokenizer.h"
#include "dlm/train/device_groups.h"
#include "dlm/train/parallel.h"
#include "dlm/train/train_checkpoint.h"
#include "dlm/train/trainer.h"
#include "train_args.h"

namespace dlm::tools {

struct ResumeState {
  train::TrainProgress progress;
  std::optional<train::AdamW> optimizer;  // none with --no-load-optim: the moments start afresh
};

struct TrainingSetup {
  ckpt::ModelConfig config;                   // the flags' (or --model-config's), vocabulary resolved
  std::unique_ptr<data::Tokenizer> tokenizer;  // none without --tokenizer-type
  std::shared_ptr<void> owned;                // the backend, the model and the split indices behind these
  std::unique_ptr<train::TrainableModel> model;
  std::unique_ptr<train::SampleSource> train, valid, test;  // valid, test: none without data or --eval-iters
  std::optional<ResumeState> resume;  // from --load
  // Tensor/pipeline parallelism: where this rank's shards sit (checkpoints are then saved by every rank).
  std::optional<train::CheckpointPlacement> placement;
  double unigram_entropy = 0;
};

// Opens the data and the checkpoint and checks them against the flags (vocabulary below the data's
// largest id, missing files, a checkpoint whose config disagrees): every error before any compute.
// The model comes from make_training_model (dlm/train/training_model.h): with `groups` of tensor or pipeline
// size above 1 it is this rank's part of the replica, and `device` holds its GPU groups (NCCL, or staged).
TrainingSetup prepare_training(TrainArgs& args, train::ProcessGroups* groups = nullptr,
                               train::DeviceGroups* device = nullptr);
// The model's shape from the flags, the tokenizer or --model-config, without data (the dry run).
ckpt::ModelConfig resolve_model(TrainArgs& args);
// The run's flags a checkpoint keeps beside its training state (data, split, batch sizes, seed, objective,
// tokenizer): what `dlm-ckpt` and a person reading metadata.json see of how it was trained.
std::map<std::string, std::string> checkpoint_metadata(const TrainArgs& args);

}  // namespace dlm::tools
