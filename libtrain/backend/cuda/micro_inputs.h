// The micro-batches' columns on the device, one set per micro-batch of a step, and the pinned host copies they
// are uploaded from (UploadStaging). The sets are allocated for the activations' shape (CudaActivationLayout's
// inputs) and go with it; the staging outlives shape changes.
#pragma once

#include <deque>
#include <vector>

#include "device_arena.h"
#include "dlm/train/cuda_memory_plan.h"
#include "kernels.h"
#include "upload_staging.h"

namespace dlm::train::cuda {

// Rows the output layer runs on are padded to a multiple of this (weight-0 copies of row 0): the logits
// GEMMs see few distinct shapes, each with whole tiles.
constexpr int kHeadRowQuantum = 128;

// One micro-batch's columns on the device (ids as this rank's vocabulary rows: -1 for another's).
// The output layer runs on the rows that carry loss weight only (the masked ones of the diffusion objective,
// about half): when head_packed, labels, weights and loss_rows hold head_count packed rows, head_rows names
// the row of each and head_slot each row's place (-1: none); otherwise head_count is every row.
struct MicroInputs {
  int *ids, *labels, *pos, *order, *head_rows, *head_slot;
  float *weights, *loss_rows;
  EmbeddingSegment* segments;
  EmbeddingCombine* combine;
  int num_segments = 0, num_combine = 0, head_count = 0;
  bool causal = false, head_packed = false;
  double router_loss_weight = 1.0;  // CudaBatch's: the MoE router losses' weight in the backward
};

struct MicroBatchInputs {
  std::vector<MicroInputs> sets;  // per micro-batch of a step
  std::deque<cuda_detail::UploadStaging> staging;  // per micro-batch: pinned copies of its uploads
  DeviceArena arena;

  // Micro-batch k's set, allocated as `layout` says on first use.
  MicroInputs& set(int k, const CudaInputsLayout& layout);
  // Micro-batch k's set as uploaded (dlm::Error when it was not).
  MicroInputs& uploaded(int k);
  cuda_detail::UploadStaging& staging_for(int k);
  void release() {
    sets.clear();
    arena.release();
  }
};

}  // namespace dlm::train::cuda
