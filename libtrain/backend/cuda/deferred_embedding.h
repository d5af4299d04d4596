// The sparse embedding's device state (CudaModel::set_sparse_embedding_grad, cuda_sparse_embedding.cpp): a flag per
// row of the untied embedding's gradient, set where its backward adds and cleared with the row by zero_grad; AdamW
// defers the rows not flagged. row_step is each row's last applied step, history the steps' AdamW scalars (a ring
// of history_steps, CudaOptions::deferred_embedding_steps); the rows are caught up when read: a forward's (the rows
// flagged in `needed`), or all of them before the whole table is read or the ring would wrap. settled: the step
// every row has reached.
#pragma once

#include <cstdint>

#include "device_arena.h"
#include "kernels.h"

namespace dlm::train::cuda {

struct DeferredEmbeddingRows {
  bool on = false;
  std::uint8_t *written = nullptr, *needed = nullptr;
  int* row_step = nullptr;
  AdamWStepScalars* history = nullptr;
  int history_steps = 0, settled = 0;
  DeviceArena arena;  // allocated on the first set_sparse_embedding_grad(true), kept after

  // Rows that lag `steps`, the optimizer's step count.
  bool deferred(int steps) const { return on && settled < steps; }
};

}  // namespace dlm::train::cuda
