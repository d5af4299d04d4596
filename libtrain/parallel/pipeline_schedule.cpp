// Megatron's pipeline schedules over Model chunks (see include/dlm/train/pipeline_schedule.h).
#include "dlm/train/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/model_adapters.h"

namespace dlm::train {

std::vector<PipelineUnit> pipeline_order(int P, int r, int V, int M) {
  if (P < 1 || r < 0 || r >= P || V < 1 || M < 1)
    fail(fmt::format("pipeline schedule: {} stages, rank {}, {} virtual stages, {} micro-batches", P, r, V, M));
  std::vector<PipelineUnit> order;
  if (V == 1) {
    const int warm = std::min(P - r - 1, M), steady = M - warm;
    for (int b = 0; b < warm; ++b) order.push_back({true, 0, b});
    for (int i = 0; i < steady; ++i) {
      order.push_back({true, 0, warm + i});
      order.push_back({false, 0, i});
    }
    for (int b = steady; b < M; ++b) order.push_back({false, 0, b});
    return order;
  }
  check_interleaved_micro_batches(P, M);
  const int total = M * V, group = P * V;
  const int warm = M == P ? total : std::min((P - r - 1) * 2 + (V - 1) * P, total), steady = total - warm;
  auto unit = [&](int k, bool forward) {
    const int in_group = k % group, chunk = in_group / P;
    return PipelineUnit{forward, forward ? chunk : V - 1 - chunk, (k / group) * P + k % P};
  };
  for (int k = 0; k < warm; ++k) order.push_back(unit(k, true));
  for (int i = 0; i < steady; ++i) {
    order.push_back(unit(warm + i, true));
    order.push_back(unit(i, false));
  }
  for (int k = steady; k < total; ++k) order.push_back(unit(k, false));
  return order;
}

void check_interleaved_micro_batches(int P, std::int64_t M) {
  if (M % P != 0)
    fail(fmt::format("the interleaved pipeline schedule needs the number of micro-batches per data-parallel rank ({}) "
                     "to be a multiple of --pipeline-model-parallel-size {}", M, P));
}

namespace {

// A micro-batch as the chunks run it. Sequence parallelism splits the batch x seq token rows over the TP
// ranks, and seq is often odd (the diffusion objective trains on seq_length - 1 tokens, and variable-length
// cuts draw any length), so under SP each row is padded at its end to a length L' with batch x L' a
// multiple of TP: the pad keys are never attended (key_valid 0), the pad labels are ignored and weigh 0,
// so every real token's loss and gradient is the unpadded batch's.
struct StageBatch {
  const ModelBatch* original = nullptr;  // the caller's micro-batch, used as it is when it needs no padding
  std::optional<ModelBatch> padded;
  std::vector<std::uint8_t> key_valid;  // empty: no padding
  const ModelBatch& batch() const { return padded ? *padded : *original; }
};

StageBatch stage_batch(const ModelBatch& b, int row_multiple) {
  StageBatch out{&b, std::nullopt, {}};
  std::int64_t len = b.seq;
  while ((b.batch * len) % row_multiple != 0) ++len;
  if (len == b.seq) return out;
  ModelBatch& p = out.padded.emplace(b);
  p.seq = len;
  auto widen = [&](const auto& v, auto pad) {
    std::vector<std::decay_t<decltype(v[0])>> w(static_cast<std::size_t>(b.batch * len), pad);
    for (std::int64_t r = 0; r < b.batch; ++r)
      std::copy_n(v.begin() + r * b.seq, b.seq, w.begin() + r * len);
    return w;
  };
  p.input_ids = widen(b.input_ids, std::int32_t{0});
  p.labels = widen(b.labels, std::int32_t{-1});
  p.weights = widen(b.weights, 0.0f);
  if (!b.masked.empty()) p.masked = widen(b.masked, std::uint8_t{0});
  std::vector<std::int32_t> positions = b.position_ids;
  if (positions.empty()) {
    positions.resize(b.input_ids.size());
    for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(b.seq));
  }
  p.position_ids = widen(positions, std::int32_t{0});
  out.key_valid = widen(std::vector<std::uint8_t>(b.input_ids.size(), 1), std::uint8_t{0});
  return out;
}

ModelInput input_of(const StageBatch& s) {
  ModelInput in = model_input(s.batch());
  in.key_valid = s.key_valid;
  return in;
}

class PipelineRun {
 public:
  PipelineRun(std::span<Model* const> chunks, Communicator& pipeline, std::span<const ModelBatch> batches)
      : chunks_(chunks), pp_(pipeline), P_(pipeline.size()), r_(pipeline.rank()),
        free_(chunks.size()), in_use_(chunks.size(), 0), max_in_use_(chunks.size(), 0) {
    if (chunks.empty()) fail("pipeline schedule: no model chunk on this rank");
    const ModelShard& shard = chunks.front()->shard();
    const int rows = shard.sequence_parallel ? shard.layout.tp : 1;
    for (const auto& b : batches) batches_.push_back(stage_batch(b, rows));
    for (std::size_t v = 0; v < chunks.size(); ++v) {
      const ModelShard& s = chunks[v]->shard();
      const int stage = static_cast<int>(v) * P_ + r_;
      if (s.stage != stage || s.layout.pp != P_ * static_cast<int>(chunks.size()))
        fail(fmt::format("pipeline schedule: chunk {} of pipeline rank {} is stage {} of {}, expected stage {} of {}", v, r_,
                         s.stage, s.layout.pp, stage, P_ * static_cast<int>(chunks.size())));
    }
  }

  void forward(int c, int b, bool training) {
    Model& m = *chunks_[static_cast<std::size_t>(c)];
    const StageBatch& stage = batches_[static_cast<std::size_t>(b)];
    const ModelBatch& batch = stage.batch();
    const int g = c * P_ + r_;
    m.use_slot(training ? take_slot(c, b) : 0);
    ModelInput in = input_of(stage);
    std::vector<float> hidden;
    if (!m.pre_process()) {
      hidden.resize(rows(m, batch));
      pp_.recv<float>(hidden, (g - 1) % P_, 2 * g);
      in.input_hidden = hidden;
    }
    const Tensor& out = m.forward(in);
    if (m.post_process()) {
      loss_ += weighted_loss(batch.weights, m.cross_entropy(batch.labels));
    } else {
      std::vector<float>& buffer = sent_.emplace_back(static_cast<std::size_t>(out.numel()));
      m.backend().copy_to_host(out, buffer);
      pp_.send_async<float>(buffer, (g + 1) % P_, 2 * (g + 1));
    }
  }

  void backward(int c, int b, const std::function<void(int, std::size_t)>& hook) {
    Model& m = *chunks_[static_cast<std::size_t>(c)];
    const ModelBatch& batch = batches_[static_cast<std::size_t>(b)].batch();
    const int g = c * P_ + r_;
    m.use_slot(slot_of_.at({c, b}));
    // A chunk runs its backwards in micro-batch order: the last one's gradients are final.
    if (hook && b + 1 == static_cast<int>(batches_.size())) m.set_gradient_hook([&hook, c](std::size_t p) { hook(c, p); });
    if (m.post_process()) {
      m.backward(batch.weights, batch.router_loss_weight);
    } else {
      std::vector<float> grad(rows(m, batch));
      pp_.recv<float>(grad, (g + 1) % P_, 2 * g + 1);
      m.backward_from_output(grad, batch.router_loss_weight);
    }
    if (!m.pre_process()) {
      std::vector<float>& buffer = sent_.emplace_back(m.input_gradient());
      pp_.send_async<float>(buffer, (g - 1 + P_) % P_, 2 * (g - 1) + 1);
    }
    m.set_gradient_hook({});
    release_slot(c, b);
  }

  double finish() {
    pp_.wait_sends();
    sent_.clear();
    pp_.all_reduce(std::span<double>(&loss_, 1));
    return loss_;
  }
  int max_in_flight() const { return *std::max_element(max_in_use_.begin(), max_in_use_.end()); }

 private:
  static std::size_t rows(const Model& m, const ModelBatch& b) {
    return static_cast<std::size_t>(m.local_rows(b.batch * b.seq) * m.config().hidden_size);
  }
  // Slots are reused once a micro-batch's backward is done: a chunk holds only what is in flight.
  int take_slot(int c, int b) {
    auto& free = free_[static_cast<std::size_t>(c)];
    int slot;
    if (free.empty()) {
      slot = in_use_[static_cast<std::size_t>(c)];
    } else {
      slot = free.back();
      free.pop_back();
    }
    ++in_use_[static_cast<std::size_t>(c)];
    max_in_use_[static_cast<std::size_t>(c)] = std::max(max_in_use_[static_cast<std::size_t>(c)], in_use_[static_cast<std::size_t>(c)]);
    slot_of_[{c, b}] = slot;
    return slot;
  }
  void release_slot(int c, int b) {
    free_[static_cast<std::size_t>(c)].push_back(slot_of_.at({c, b}));
    --in_use_[static_cast<std::size_t>(c)];
    slot_of_.erase({c, b});
  }

  std::span<Model* const> chunks_;
  Communicator& pp_;
  std::vector<StageBatch> batches_;
  int P_, r_;
  double loss_ = 0;
  std::deque<std::vector<float>> sent_;  // send_async buffers, alive until wait_sends()
  std::vector<std::vector<int>> free_;
  std::vector<int> in_use_, max_in_use_;
  std::map<std::pair<int, int>, int> slot_of_;
};

}  // namespace

double pipeline_forward_backward(std::span<Model* const> chunks, Communicator& pipeline,
                                 std::span<const ModelBatch> batches, PipelineCounters* counters,
                                 const std::function<void(int, std::size_t)>& gradient_hook) {
  PipelineRun run(chunks, pipeline, batches);
  const auto order = pipeline_order(pipeline.size(), pipeline.rank(), static_cast<int>(chunks.size()),
                                    static_cast<int>(batches.size()));
  for (const PipelineUnit& u : order) {
    if (u.forward) run.forward(u.chunk, u.micro_batch, true);
    else run.backward(u.chunk, u.micro_batch, gradient_hook);
  }
  if (counters) counters->max_in_flight = run.max_in_flight();
  return run.finish();
}

double pipeline_forward_only(std::span<Model* const> chunks, Communicator& pipeline, std::span<const ModelBatch> batches) {
  PipelineRun run(chunks, pipeline, batches);
  // Forward units in the schedule's order of forwards: every stage meets its inputs in the order sent.
  for (const PipelineUnit& u : pipeline_order(pipeline.size(), pipeline.rank(), static_cast<int>(chunks.size()),
                                              static_cast<int>(batches.size())))
    if (u.forward) run.forward(u.chunk, u.micro_batch, false);
  return run.finish();
}

}  // namespace dlm::train
