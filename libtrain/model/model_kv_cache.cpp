// Model's block KV cache for the samplers (model.h, forward_storing_kv / forward_window): the keys and
// values of a full forward kept per layer, and forwards of a window of columns that attend to them.
// A window pass is forward() over [batch, window] rows whose attention reads [batch, seq] keys: the
// stored ones, with the window's own (computed from its current ids) written over its columns. Every op
// is per row except attention, and attention's query row reads the same keys in the same order as in
// a full forward, so a window right after storing from the same ids gives the full forward's rows.
#include <fmt/format.h>

#include "dlm/common/error.h"
#include "model_internal.h"

namespace dlm::train {

namespace {

constexpr int kWindowSlot = 1;

}  // namespace

const Tensor& Model::forward_storing_kv(const ModelInput& in) {
  if (shard_.layout.tp != 1 || shard_.layout.pp != 1)
    fail("model: the sampling KV cache runs on the whole model (no tensor or pipeline parallelism)");
  if (in.attention != AttentionKind::kBidirectional)
    fail("model: the sampling KV cache is for bidirectional attention (a diffusion model)");
  check_input(in);
  if (!kv_ || kv_->batch != in.batch || kv_->seq != in.seq) {
    kv_.reset();  // free the old shape's memory first
    auto kv = std::make_shared<KvStore>();
    kv->batch = in.batch;
    kv->seq = in.seq;
    const std::vector<std::int64_t> shape{in.batch, in.seq, config_.num_query_groups, config_.kv_channels};
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      kv->k.push_back(backend_.alloc(shape, DType::kF32));
      kv->v.push_back(backend_.alloc(shape, DType::kF32));
    }
    kv->k_all = backend_.alloc(shape, DType::kF32);
    kv->v_all = backend_.alloc(shape, DType::kF32);
    kv->key_valid = backend_.alloc({in.batch, in.seq}, DType::kU8);
    kv_ = std::move(kv);
  }
  return forward_pass(in, true, -1);
}

const Tensor& Model::forward_window(const ModelInput& in, std::int64_t first, std::int64_t end) {
  if (!kv_) fail("model: forward_window() before forward_storing_kv()");
  check_input(in);
  if (in.batch != kv_->batch || in.seq != kv_->seq)
    fail(fmt::format("model: a window of a batch {} x {}, but the stored keys are of {} x {}", in.batch, in.seq,
                     kv_->batch, kv_->seq));
  if (in.attention != AttentionKind::kBidirectional)
    fail("model: the sampling KV cache is for bidirectional attention (a diffusion model)");
  if (first < 0 || first >= end || end > in.seq)
    fail(fmt::format("model: window columns [{}, {}) outside a sequence of {}", first, end, in.seq));
  // The window's keys are masked by this input's key padding (the samplers keep the stored forward's).
  kv_->has_key_valid = !in.key_valid.empty();
  if (kv_->has_key_valid) backend_.copy_from_host(kv_->key_valid, in.key_valid);
  const std::int64_t B = in.batch, L = in.seq, W = end - first;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B * W)), positions(ids.size());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < W; ++j) {
      const auto at = static_cast<std::size_t>(b * L + first + j), to = static_cast<std::size_t>(b * W + j);
      ids[to] = in.ids[at];
      positions[to] = in.positions.empty() ? static_cast<std::int32_t>(first + j) : in.positions[at];
    }
  ModelInput w;
  w.batch = B;
  w.seq = W;
  w.ids = ids;
  w.positions = positions;
  w.attention = AttentionKind::kBidirectional;
  const int slot = slot_;
  use_slot(kWindowSlot);
  const Tensor& logits = forward_pass(w, false, first);
  use_slot(slot);
  return logits;
}

void Model::store_kv(std::size_t l, const Tensor& k, const Tensor& v) {
  backend_.copy(kv_->k[l], k.reshape(kv_->k[l].shape()));
  backend_.copy(kv_->v[l], v.reshape(kv_->v[l].shape()));
}

const Model::KvStore& Model::window_kv(std::size_t l, const Tensor& k, const Tensor& v, std::int64_t first) {
  KvStore& kv = *kv_;
  const std::int64_t B = kv.batch, L = kv.seq, W = k.dim(0) / B;
  const std::int64_t g = config_.num_query_groups, d = config_.kv_channels;
  const Tensor k_all = kv.k_all.reshape({B * L, g, d}), v_all = kv.v_all.reshape({B * L, g, d});
  backend_.copy(kv.k_all, kv.k[l]);
  backend_.copy(kv.v_all, kv.v[l]);
  for (std::int64_t b = 0; b < B; ++b) {
    backend_.copy(k_all.rows(b * L + first, W), k.rows(b * W, W));
    backend_.copy(v_all.rows(b * L + first, W), v.rows(b * W, W));
  }
  return kv;
}

}  // namespace dlm::train
