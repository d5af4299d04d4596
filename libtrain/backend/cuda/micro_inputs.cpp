// Micro-batches to the device: the host checks and prepares each micro-batch's columns (this rank's vocabulary
// rows, the head's packed rows, the embedding backward's grouping), then copies them out of pinned memory in one
// go (UploadStaging).
#include "micro_inputs.h"

#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "cuda_model_impl.h"
#include "dlm/common/error.h"

namespace dlm::train {
namespace cuda {

MicroInputs& MicroBatchInputs::set(int k, const CudaInputsLayout& layout) {
  if (k < 0) fail(fmt::format("CudaModel: micro-batch {}", k));
  while (static_cast<int>(sets.size()) <= k) {
    auto& in = sets.emplace_back();
    const std::int64_t n = layout.columns;
    in.ids = arena.alloc<int>(n), in.labels = arena.alloc<int>(n), in.pos = arena.alloc<int>(n);
    in.order = arena.alloc<int>(n), in.head_rows = arena.alloc<int>(n), in.head_slot = arena.alloc<int>(n);
    in.weights = arena.alloc<float>(n), in.loss_rows = arena.alloc<float>(n);
    in.segments = arena.alloc<EmbeddingSegment>(layout.segments);
    in.combine = arena.alloc<EmbeddingCombine>(layout.combine);
  }
  return sets[static_cast<std::size_t>(k)];
}

MicroInputs& MicroBatchInputs::uploaded(int k) {
  if (k < 0 || k >= static_cast<int>(sets.size())) fail(fmt::format("CudaModel: micro-batch {} was not uploaded", k));
  return sets[static_cast<std::size_t>(k)];
}

cuda_detail::UploadStaging& MicroBatchInputs::staging_for(int k) {
  while (static_cast<int>(staging.size()) <= k) staging.emplace_back();
  return staging[static_cast<std::size_t>(k)];
}

}  // namespace cuda

void upload_micro_batch(CudaModel::Impl& I, int k, const CudaBatch& b, Upload use) {
  const auto& c = I.cfg;
  const std::int64_t n = b.batch * b.seq;
  if (b.batch <= 0 || b.seq <= 0 || static_cast<std::int64_t>(b.ids.size()) != n ||
      static_cast<std::int64_t>(b.labels.size()) != n || static_cast<std::int64_t>(b.weights.size()) != n ||
      (!b.positions.empty() && static_cast<std::int64_t>(b.positions.size()) != n))
    fail(fmt::format("CudaModel: micro-batch columns disagree with its shape {} x {}", b.batch, b.seq));
  if (b.seq > c.max_position_embeddings)
    fail(fmt::format("CudaModel: seq {} beyond max_position_embeddings {}", b.seq, c.max_position_embeddings));
  if (I.sp && n % I.tp != 0)
    fail(fmt::format("CudaModel: sequence parallelism splits the {} x {} token rows over {} ranks: they must divide",
                     b.batch, b.seq, I.tp));
  std::vector<std::int32_t> positions(b.positions.begin(), b.positions.end());
  if (positions.empty())
    for (std::int64_t i = 0; i < n; ++i) positions.push_back(static_cast<std::int32_t>(i % b.seq));
  std::vector<std::int32_t> ids(b.ids.begin(), b.ids.end());
  for (std::int64_t i = 0; i < n; ++i) {
    if (b.ids[i] < 0 || b.ids[i] >= c.vocab_size)
      fail(fmt::format("CudaModel: token {} at position {} outside the vocabulary of {}", b.ids[i], i, c.vocab_size));
    if (b.weights[i] != 0 && (b.labels[i] < 0 || b.labels[i] >= c.vocab_size))
      fail(
          fmt::format("CudaModel: label {} at position {} outside the vocabulary of {}", b.labels[i], i, c.vocab_size));
    if (positions[i] < 0 || positions[i] > c.max_position_embeddings)
      fail(fmt::format("CudaModel: position {} at {} beyond max_position_embeddings", positions[i], i));
    // Vocabulary-parallel embedding: this rank's rows of the table, -1 for the others'.
    const std::int64_t local = ids[i] - I.vocab_first;
    ids[i] = local >= 0 && local < I.vpad() ? static_cast<std::int32_t>(local) : -1;
  }
  if (use == Upload::kWindow) {
    if (n > I.acts.T) fail(fmt::format("CudaModel: a window of {} rows, but activations for {}", n, I.acts.T));
  } else if (b.batch != I.acts.B || b.seq != I.acts.S) {
    if (k != 0) fail("CudaModel: the micro-batches of a step must have one shape");
    I.ensure_acts(b.batch, b.seq);
  }
  MicroInputs& in = I.input_set(k);
  in.causal = b.causal;
  in.router_loss_weight = b.router_loss_weight;
  // The host's work first, the copies last: they go out of pinned memory together (UploadStaging).
  struct Column {
    void* dst;
    const void* src;
    std::size_t bytes;
  };
  std::vector<Column> columns{{in.ids, ids.data(), static_cast<std::size_t>(n) * 4},
                              {in.pos, positions.data(), static_cast<std::size_t>(n) * 4}};
  in.head_packed = false, in.head_count = static_cast<int>(n);
  std::vector<int> rows, slot, labels;
  std::vector<float> weights;
  if (use != Upload::kSampling && use != Upload::kWindow) {
    // The rows with loss weight, padded to whole quanta by weight-0 copies of row 0; packed when that is fewer.
    slot.assign(static_cast<std::size_t>(n), -1);
    for (std::int64_t i = 0; i < n; ++i)
      if (b.weights[i] != 0) slot[i] = static_cast<int>(rows.size()), rows.push_back(static_cast<int>(i));
    const std::int64_t padded = (static_cast<std::int64_t>(rows.size()) + kHeadRowQuantum - 1) / kHeadRowQuantum *
                                kHeadRowQuantum;
    if (I.post && padded < n) {
      for (int r : rows) labels.push_back(b.labels[r]), weights.push_back(b.weights[r]);
      rows.resize(static_cast<std::size_t>(padded), 0), labels.resize(rows.size(), 0),
          weights.resize(rows.size(), 0.0f);
      columns.push_back({in.head_slot, slot.data(), static_cast<std::size_t>(n) * 4});
      if (padded > 0) {
        columns.push_back({in.head_rows, rows.data(), rows.size() * 4});
        columns.push_back({in.labels, labels.data(), labels.size() * 4});
        columns.push_back({in.weights, weights.data(), weights.size() * 4});
      }
      in.head_packed = true, in.head_count = static_cast<int>(padded);
    } else {
      columns.push_back({in.labels, b.labels.data(), static_cast<std::size_t>(n) * 4});
      columns.push_back({in.weights, b.weights.data(), static_cast<std::size_t>(n) * 4});
    }
  }
  in.num_segments = in.num_combine = 0;
  std::vector<int> order;
  std::vector<EmbeddingSegment> segments;
  std::vector<EmbeddingCombine> combine;
  if (use == Upload::kTraining && I.pre) {
    // Tokens grouped by id for the embedding backward (deterministic, no atomics).
    embedding_plan(ids.data(), static_cast<int>(n), order, segments, combine);
    columns.push_back({in.order, order.data(), order.size() * 4});
    columns.push_back({in.segments, segments.data(), segments.size() * sizeof(EmbeddingSegment)});
    if (!combine.empty()) columns.push_back({in.combine, combine.data(), combine.size() * sizeof(EmbeddingCombine)});
    in.num_segments = static_cast<int>(segments.size());
    in.num_combine = static_cast<int>(combine.size());
  }
  const cudaStream_t st = I.stream;
  std::size_t bytes = 0;
  for (const Column& col : columns) bytes += UploadStaging::room(col.bytes);
  UploadStaging& staging = I.inputs.staging_for(k);
  staging.begin(bytes);
  for (const Column& col : columns) staging.copy(col.dst, col.src, col.bytes, st);
  staging.end(st);
  // A shard's step enqueues collectives after its uploads: they are complete before the first one, so the host
  // never waits on a stream that holds NCCL work.
  if (!I.whole()) check_cuda(cudaStreamSynchronize(st), "upload");
}

}  // namespace dlm::train
