// The native distributed checkpoint: HDF5 shard files written by each rank, metadata.json, and a
// model.h5 of virtual datasets that shows every global tensor whole (h5py reads it with no dlm code).
//
//   ROOT/latest                      "iter_0000100\n", replaced atomically after the folder is final
//   ROOT/iter_0000100/metadata.json  format, model config, parallel layout, every global tensor's shape,
//                                    dtype and which file holds which slice (with XXH64 checksums),
//                                    training state
//   ROOT/iter_0000100/rank_tp00_pp01.h5   /model/<name>, /exp_avg/<name>, /exp_avg_sq/<name>: the
//                                    rank's local fp32 tensors (sharding.h), only those it saves
//   ROOT/iter_0000100/model.h5       /model/<name>, ... as virtual datasets of global shape
// Master weights and Adam moments are stored in model space (global tensor slices), so a checkpoint
// loads under any TP/PP/DP layout; a rank loading reads only the hyperslabs it needs.
//
// Commit protocol: everything is written into ROOT/iter_XXXXXXX.tmp/ and fsynced; the folder is renamed
// to iter_XXXXXXX and the root fsynced; then `latest` is replaced (temp + fsync + rename). A crash at any
// point leaves `latest` naming the previous complete checkpoint; readers never open a *.tmp folder.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/sharding.h"
#include "dlm/ckpt/tensor.h"

namespace dlm::ckpt {

// What a run needs besides tensors to continue where it stopped. The *_json fields are JSON texts the
// trainer owns (stored as JSON objects in metadata.json; "" is stored as {}).
struct TrainingState {
  std::int64_t iteration = 0;
  std::int64_t consumed_samples = 0;
  std::int64_t optimizer_steps = 0;
  std::string lr_schedule_json{}, rng_json{}, data_json{}, args_json{};
};

// Parameters and (optionally, when non-empty) AdamW moments, by global tensor name. For a rank they
// hold the local shapes of rank_shards(); for the whole model, the global shapes.
struct TrainingTensors {
  TensorSet params, exp_avg, exp_avg_sq;
  bool has_optimizer() const { return !exp_avg.empty(); }
};

// A rank's fp32 values as the caller holds them, by global tensor name: each points at the shard's local shape
// (rank_shards()) in row-major order, and stays valid until write_rank returns. Values 4 KiB-aligned in memory
// go to the disk without a copy (O_DIRECT straight from them); others pass through the writer's aligned buffers.
struct TrainingViews {
  std::map<std::string, const float*> params, exp_avg, exp_avg_sq;
  bool has_optimizer() const { return !exp_avg.empty(); }
};

// metadata.json, parsed.
struct ShardRecord {
  std::string file;                              // relative to the checkpoint folder
  std::vector<std::int64_t> local_shape;
  std::vector<ShardPiece> pieces;
  std::map<std::string, std::string> checksums;  // group ("model", "exp_avg", ...) -> "xxh64:..."
};
struct TensorRecord {
  std::string name;
  std::vector<std::int64_t> shape;
  TensorDType dtype = TensorDType::kFloat32;
  bool is_norm = false;
  std::vector<ShardRecord> shards;
};
struct CheckpointMetadata {
  int version = 1;
  ModelConfig config;
  ParallelLayout layout;
  TrainingState state;
  std::vector<std::string> groups;  // "model" and, with an optimizer, "exp_avg", "exp_avg_sq"
  std::vector<TensorRecord> tensors;
};
std::string metadata_to_json(const CheckpointMetadata& metadata);
// Checks types, ranges and that every slice lies inside its tensor and file dataset; throws dlm::Error
// naming `file` and the field.
CheckpointMetadata metadata_from_json(std::string_view text, const std::string& file);

// "iter_0000100".
std::string iteration_dir_name(std::int64_t iteration);
// A checkpoint folder from a root (through `latest`) or a folder holding metadata.json. Refuses *.tmp.
std::string resolve_checkpoint(const std::string& path);

class CheckpointWriter {
 public:
  CheckpointWriter(std::string root, std::int64_t iteration, ModelConfig config, ParallelLayout layout);
  // Rank 0, before any rank writes: removes stale *.tmp folders under root and creates the temp folder.
  void begin();
  // Every (tp_rank, pp_rank, ep_rank) with (expert-)data-parallel rank 0 writes its own shard file from its local
  // tensors (rank_tpXX_ppYY.h5; with expert parallelism rank_tpXX_ppYY_epZZ.h5).
  void write_rank(int tp_rank, int pp_rank, const TrainingTensors& local, int ep_rank = 0);
  void write_rank(int tp_rank, int pp_rank, const TrainingViews& local, int ep_rank = 0);
  // For a commit that cannot wait at a barrier (a background save): whether every rank's write_rank has finished
  // (its checksum file is in the temp folder). Throws, with the rank's message, when one reported a failure.
  bool all_ranks_written() const;
  // A rank whose write failed leaves its message for the committing rank (all_ranks_written throws it).
  void report_failure(int tp_rank, int pp_rank, const std::string& message, int ep_rank = 0) const;
  // Rank 0, after every rank wrote: metadata.json, model.h5, fsync, rename, `latest`. Returns the final folder.
  std::string commit(TrainingState state);
  const std::string& temp_dir() const { return temp_dir_; }

 private:
  // Refuses an iteration `latest` already committed; removes a complete but uncommitted leftover of it.
  void claim_final_dir() const;
  std::string root_, temp_dir_, final_dir_;
  std::int64_t iteration_;
  ModelConfig config_;
  ParallelLayout layout_;
};

// Saves whole-model tensors under `layout` by running every rank's write_rank in this process (the same
// code path a distributed run takes). Returns the final folder.
std::string save_checkpoint(const std::string& root, const ModelConfig& config, const ParallelLayout& layout,
                            const TrainingTensors& global, const TrainingState& state);

class CheckpointReader {
 public:
  // `path`: a root with `latest` or a checkpoint folder.
  explicit CheckpointReader(const std::string& path);
  const std::string& dir() const { return dir_; }
  const CheckpointMetadata& metadata() const { return metadata_; }
  // The local tensors of (tp_rank, pp_rank) under `layout` (any layout: only the needed slabs are read).
  // Source datasets read whole have their checksums verified.
  TrainingTensors read_rank(const ParallelLayout& layout, int tp_rank, int pp_rank, bool with_optimizer = true,
                            int ep_rank = 0) const;
  TrainingTensors read_global(bool with_optimizer = true) const { return read_rank({}, 0, 0, with_optimizer); }

 private:
  std::string dir_;
  CheckpointMetadata metadata_;
};

}  // namespace dlm::ckpt
