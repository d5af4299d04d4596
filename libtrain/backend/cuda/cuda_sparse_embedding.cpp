// CudaModel's sparse embedding (set_sparse_embedding_grad): the untied table's gradient kept as the rows the
// step's tokens wrote, and AdamW's update of the other rows deferred until they are read. A row no token wrote
// has g = 0, so its update is m <- b1 m, v <- b2 v, p <- p (1 - lr wd) - step_size m / (sqrt(v) / bc2 + eps)
// with that step's scalars: adamw.cu replays those steps in order, with the same arithmetic, when a forward is
// about to read the row (its tokens') or before anything reads the whole table (exports, imports, sampling, a
// change of step count). The weights, moments, losses and gradients are the same bits as updating every row
// every step (tests/gpu/cuda_sparse_embedding_test.cpp); the step moves only the rows its tokens touched.
#include <fmt/format.h>

#include "cuda_model_impl.h"
#include "dlm/common/error.h"

namespace dlm::train {

AdamWTensor CudaModel::Impl::embedding_rows() const {
  const ParameterStore& P = params;
  const std::int64_t at = P.offset[emb];
  AdamWTensor t{P.w16 + at, P.w_lo + at, nullptr, P.G(emb), P.m + at, P.v + at, P.numel(emb), 0.0f};
  t.rows_written = deferred.written, t.row_len = d(), t.row_step = deferred.row_step;
  return t;
}

void CudaModel::Impl::catch_up_rows(const int* ids, int tokens) {
  if (!rows_deferred()) return;
  before_state_write();
  cuda::mark_rows(ids, tokens, deferred.needed, stream);
  cuda::adamw_catch_up(embedding_rows(), deferred.needed, params.steps, deferred.history, deferred.history_steps,
                       stream);
  check_cuda(cudaGetLastError(), "embedding catch-up");
}

void CudaModel::Impl::settle_embedding() {
  if (!rows_deferred()) return;
  before_state_write();
  cuda::adamw_catch_up(embedding_rows(), nullptr, params.steps, deferred.history, deferred.history_steps, stream);
  check_cuda(cudaGetLastError(), "embedding catch-up");
  deferred.settled = params.steps;
}

void CudaModel::Impl::embedding_rows_current() {
  cuda::fill_row_step(deferred.row_step, params.numel(emb) / d(), params.steps, stream);
  deferred.settled = params.steps;
}

// Before AdamW's step `steps + 1`: its scalars into the ring, first bringing every row up to date when a row
// could still need the slot this one overwrites.
void CudaModel::Impl::record_adamw_step(const AdamWStepScalars& s) {
  if (!deferred.on) return;
  const int steps = params.steps;
  if (steps + 1 - deferred.settled > deferred.history_steps) settle_embedding();
  cuda::adamw_record_step(deferred.history + (steps + 1) % deferred.history_steps, s, stream);
}

void CudaModel::set_sparse_embedding_grad(bool on) {
  auto& I = *impl_;
  if (on == I.deferred.on) return;
  if (on && (I.emb < 0 || !I.pre || I.out == I.emb || I.params.sharded()))
    fail("CudaModel: a sparse embedding gradient needs this rank's untied embedding and no optimizer shards");
  I.settle_embedding();
  const std::int64_t rows = I.params.numel(I.emb) / I.d();
  if (on && !I.deferred.written) {
    DeferredEmbeddingRows& r = I.deferred;
    r.written = r.arena.alloc<std::uint8_t>(rows);
    r.needed = r.arena.alloc<std::uint8_t>(rows);
    r.row_step = r.arena.alloc<int>(rows);
    // Steps kept for deferred rows; every this many steps all rows are brought up to date (one dense pass).
    r.history_steps = I.options.deferred_embedding_steps;
    r.history = r.arena.alloc<AdamWStepScalars>(r.history_steps);
    check_cuda(cudaMemsetAsync(I.deferred.needed, 0, static_cast<std::size_t>(rows), I.stream), "flags");
  }
  if (on) {
    // Every row flagged: the gradient may hold anything so far, and the next zero_grad clears all of it. Every
    // row is up to date.
    check_cuda(cudaMemsetAsync(I.deferred.written, 1, static_cast<std::size_t>(rows), I.stream), "flags");
    I.embedding_rows_current();
  }
  I.deferred.on = on;
  I.build_zero_runs();
}

bool CudaModel::sparse_embedding_grad() const { return impl_->deferred.on; }

}  // namespace dlm::train
