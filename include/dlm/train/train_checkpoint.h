// Training checkpoints on disk, in libckpt's native distributed format (dlm/ckpt/checkpoint.h):
// ROOT/latest -> iter_XXXXXXX/ with metadata.json (model config, tensors, training state) and HDF5
// shards of the weights and the AdamW moments (fp32, model space), committed atomically: an
// interrupted save leaves `latest` naming the previous complete checkpoint. The training state holds
// iteration, consumed samples and optimizer steps; the data order, the noise and the LR are functions
// of those, so a resume continues the same run bit for bit. `dlm-ckpt convert` turns the folder into a
// Hugging Face model. Parameters must be the model's global tensors (model_tensors(config)).
#pragma once

#include <map>
#include <span>
#include <string>

#include "dlm/ckpt/checkpoint.h"
#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/tensor.h"
#include "dlm/ckpt/sharding.h"
#include "dlm/train/communicator.h"
#include "dlm/train/optimizer.h"
#include "dlm/train/trainer.h"

namespace dlm::train {

void save_train_checkpoint(const std::string& save_dir, const ckpt::ModelConfig& config,
                           std::span<const ParamRef> params, const AdamW& optimizer, const TrainProgress& progress,
                           const std::map<std::string, std::string>& extra_metadata = {});

// Where a rank's parameters sit in a model-parallel layout (model_parallel.h): its tensor rank and the
// stage of each of its chunks under `layout` (layout.pp = pipeline ranks x virtual stages). The
// default is the whole model on one rank. Under expert parallelism (layout.ep > 1) the rank's expert-parallel
// rank says which experts it holds.
struct CheckpointPlacement {
  ckpt::ParallelLayout layout{};
  int tensor_rank = 0;
  std::vector<int> stages{0};
  int expert_rank = 0;
};

// A model-parallel save, collective over `world`: world rank 0 opens the checkpoint, every rank with
// `writes` (data-parallel rank 0 of each tensor/pipeline position) writes its shard files (one per chunk)
// from its local parameters and whole moments, and rank 0 commits once all are written. An interrupted
// save leaves `latest` as it was.
void save_train_checkpoint_sharded(const std::string& save_dir, const ckpt::ModelConfig& config,
                                   std::span<const ParamRef> params, const AdamW& optimizer,
                                   const TrainProgress& progress, const CheckpointPlacement& placement,
                                   Communicator& world, bool writes,
                                   const std::map<std::string, std::string>& extra_metadata = {});

// One save point's state as views: the parameters (names, values, global shapes) and, once AdamW has stepped, its
// moments in the same order. The memory is the caller's: the live training state, or a snapshot of it.
struct StateViews {
  std::vector<ParamRef> params;
  std::vector<std::span<const float>> exp_avg, exp_avg_sq;
  std::int64_t optimizer_steps = 0;
};
StateViews state_views(std::span<const ParamRef> params, const AdamW& optimizer);

// Writes this rank's shard files of `state` (one per stage of `placement`) into `writer`'s temporary folder:
// straight from the views' memory, with no copy of the tensors.
void write_rank_shards(ckpt::CheckpointWriter& writer, const ckpt::ModelConfig& config, const StateViews& state,
                       const CheckpointPlacement& placement);
// The training state metadata.json records.
ckpt::TrainingState training_state(std::int64_t optimizer_steps, const TrainProgress& progress,
                                   const std::map<std::string, std::string>& extra_metadata);

// The folder --load reads: the newer of `load_dir`'s checkpoint and the non-persistent one in `non_persistent_dir`
// ("" when there is none), the non-persistent one on a tie, as Megatron's _load_base_checkpoint chooses. "" when
// neither folder holds a checkpoint (its tracker `latest`).
std::string newest_checkpoint_root(const std::string& load_dir, const std::string& non_persistent_dir);

struct TrainCheckpoint {
  std::string dir;  // the iter_* folder read
  ckpt::ModelConfig config;
  ckpt::TensorSet weights;
  AdamW optimizer{{}};  // moments in the order of the `params` given to load; options from the caller
  TrainProgress progress;
  std::map<std::string, std::string> metadata;
};

// Reads the newest checkpoint of `load_dir` (through `latest`), or the folder itself when it is an
// iter_* folder. The moments are ordered as `params` (names) and get `adam` as options. Throws
// dlm::Error naming the file and tensor when something is missing or has another shape.
// With a placement, the weights and moments are this rank's slices (read_rank: only the needed hyperslabs),
// whatever layout saved the checkpoint.
TrainCheckpoint load_train_checkpoint(const std::string& load_dir, std::span<const ParamRef> params,
                                      const AdamWOptions& adam, const CheckpointPlacement& placement);
// The whole model on one rank. (An overload rather than a default argument: GCC 12 warns, wrongly, that the
// default's temporary vector may be used uninitialised wherever the call is inlined.)
TrainCheckpoint load_train_checkpoint(const std::string& load_dir, std::span<const ParamRef> params,
                                      const AdamWOptions& adam);

// A checkpoint's model against the flags: the first field that differs, as a dlm::Error naming the
// checkpoint file, the field and both values.
void check_config_matches(const ckpt::ModelConfig& flags, const ckpt::ModelConfig& checkpoint, const std::string& file);

// Copies the weights into the parameters (names and sizes must match).
void restore_weights(const TrainCheckpoint& checkpoint, std::span<const ParamRef> params);

}  // namespace dlm::train
