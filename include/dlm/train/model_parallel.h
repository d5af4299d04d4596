// One rank's part of a model-parallel replica: its pipeline chunks (one, or --num-layers-per-virtual-
// pipeline-stage's several), each cut to the rank's tensor-parallel shard (model.h), and how the trainer
// runs them (trainer.h's TrainableModel): the pipeline schedule (pipeline_schedule.h), the gradients
// shared between ranks (replicated norms over the tensor group; with tied embeddings and more than one
// stage, the embedding of the first stage and its replica on the last, summed over the two, as
// Megatron's embedding group does), and the gradient norm summed over tensor and pipeline ranks.
#pragma once

#include <memory>
#include <vector>

#include "dlm/ckpt/sharding.h"
#include "dlm/train/model.h"
#include "dlm/train/parallel.h"
#include "dlm/train/trainer.h"

namespace dlm::train {

struct ModelParallelOptions {
  bool sequence_parallel = false;    // --sequence-parallel
  int virtual_stages = 1;            // chunks per pipeline rank (from --num-layers-per-virtual-pipeline-stage)
  std::vector<int> layers_per_stage;  // layers of each global chunk (empty: balanced)
};

// Chunks per rank for --num-layers-per-virtual-pipeline-stage N (0: not interleaved): num_layers /
// (PP x N), a dlm::Error naming the flags when it does not divide.
int virtual_stages_for(const ckpt::ModelConfig& config, int pipeline, int layers_per_virtual_stage);

class ParallelModel {
 public:
  // No collectives (`groups` must outlive this).
  ParallelModel(const ckpt::ModelConfig& config, Backend& backend, ProcessGroups& groups, ModelParallelOptions options);
  ~ParallelModel();

  // libckpt's layout of the chunks: tp, pp = pipeline ranks x virtual stages.
  const ckpt::ParallelLayout& layout() const { return layout_; }
  int tensor_rank() const { return groups_.coords.tensor; }
  // This rank's chunks in virtual-stage order; chunk v is global stage stage_of(v).
  const std::vector<std::unique_ptr<Model>>& chunks() const { return chunks_; }
  int stage_of(std::size_t chunk) const { return static_cast<int>(chunk) * groups_.config.pipeline + groups_.coords.pipeline; }
  ProcessGroups& groups() const { return groups_; }
  const ModelParallelOptions& options() const { return options_; }

  void init(std::uint64_t seed);
  // Tied embeddings over more than one stage: the last stage holds a replica of the first's table.
  bool tied_across_stages() const { return tied_across_stages_; }

  // Every chunk's parameters, in chunk then model order (the trainer's and checkpoints' order).
  std::vector<Parameter*> parameters();
  // The first and last pipeline ranks' group (null elsewhere and without tied embeddings across stages);
  // collective over the pipeline group on its first call.
  Communicator* embedding_group();

 private:
  ProcessGroups& groups_;
  ModelParallelOptions options_;
  ckpt::ParallelLayout layout_;
  std::vector<std::unique_ptr<Model>> chunks_;
  std::unique_ptr<Communicator> embedding_group_;  // first and last pipeline rank (tied embeddings, PP > 1)
  bool tied_across_stages_ = false, embedding_group_made_ = false;
};

// The trainer's view of a ParallelModel (host fp32 backend memory, as make_trainable_model).
std::unique_ptr<TrainableModel> make_trainable_model(ParallelModel& model);

}  // namespace dlm::train
