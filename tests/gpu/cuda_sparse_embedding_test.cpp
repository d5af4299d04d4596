// The embedding's gradient read and cleared only where tokens wrote it, and AdamW's update of the other rows deferred
// until they are read (CudaModel::set_sparse_embedding_grad), against the dense path: rows no token wrote hold zeros,
// which add nothing to the norm and give AdamW's update for g = 0, so the norms, the gradients, the weights and the
// moments must be the same bits, with clipping on, over accumulated micro-batches and over steps whose tokens fall on
// different rows (the rows of one step must be cleared before the next).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/common/error.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/optimizer.h"
#include "gpu_test_util.h"

namespace dlm::train {
namespace {

std::unique_ptr<CudaModel> deterministic_model(const ckpt::ModelConfig& c) {
  return gpu_test::deterministic_model(c, 5);
}

using Columns = gpu_test::MaskedColumns;
// Tokens from rows [first, first + span) of the vocabulary and the mask token, half of them masked.
Columns columns_on_rows(std::mt19937& rng, std::int64_t n, int first, int span, int mask) {
  return gpu_test::masked_columns(rng, n, first, span, mask, 0.02f);
}

// The same model twice: dense, and with the sparse gradient and a ring of 3 deferred steps
// (CudaOptions::deferred_embedding_steps).
std::pair<std::unique_ptr<CudaModel>, std::unique_ptr<CudaModel>> dense_and_deferred(const ckpt::ModelConfig& c) {
  CudaOptions ring = gpu_test::deterministic_options();
  ring.deferred_embedding_steps = 3;
  auto sparse = gpu_test::model_with(c, ring, 5);
  sparse->set_sparse_embedding_grad(true);
  return {deterministic_model(c), std::move(sparse)};
}

void expect_same_state(CudaModel& dense, CudaModel& sparse, const char* when) {
  for (const auto& t : dense.tensors()) {
    EXPECT_EQ(dense.export_gradient(t.name), sparse.export_gradient(t.name)) << when << ": " << t.name;
    EXPECT_EQ(dense.export_parameter(t.name), sparse.export_parameter(t.name)) << when << ": " << t.name;
    EXPECT_EQ(dense.export_exp_avg(t.name), sparse.export_exp_avg(t.name)) << when << ": " << t.name;
    EXPECT_EQ(dense.export_exp_avg_sq(t.name), sparse.export_exp_avg_sq(t.name)) << when << ": " << t.name;
  }
}

// One training step of both models on `x` (AdamW at lr 1e-2, clipping at 1): the same loss and norm.
void step_both(CudaModel& dense, CudaModel& sparse, const Columns& x, std::int64_t batch, std::int64_t seq) {
  const CudaBatch b{batch, seq, false, x.ids, x.labels, {}, x.weights};
  const AdamWOptions adam;
  EXPECT_EQ(sparse.forward_backward(b), dense.forward_backward(b));
  EXPECT_EQ(sparse.adamw_step(adam, 1e-2, 1.0), dense.adamw_step(adam, 1e-2, 1.0));
  dense.zero_grad(), sparse.zero_grad();
}

std::int64_t nonzero(const std::vector<float>& v) {
  std::int64_t n = 0;
  for (float x : v) n += x != 0.0f;
  return n;
}

TEST(CudaSparseEmbedding, SameBitsAsTheDenseGradient) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = gpu_test::small_config();
  auto dense = deterministic_model(c), sparse = deterministic_model(c);
  sparse->set_sparse_embedding_grad(true);
  ASSERT_TRUE(sparse->sparse_embedding_grad());
  ASSERT_FALSE(dense->sparse_embedding_grad());
  const std::string emb = "embedding.word_embeddings.weight";
  const std::int64_t batch = 2, seq = 64, n = batch * seq;
  std::mt19937 rng(17);
  AdamWOptions adam;
  for (int step = 0; step < 4; ++step) {
    // Two micro-batches a step on rows that move every step, so each step leaves rows the next does not write.
    for (int micro = 0; micro < 2; ++micro) {
      const Columns x = columns_on_rows(rng, n, 40 * step + 7 * micro, 30, *c.mask_token_id);
      const CudaBatch b{batch, seq, false, x.ids, x.labels, {}, x.weights};
      EXPECT_EQ(sparse->forward_backward(b), dense->forward_backward(b)) << "step " << step;
    }
    const auto g = sparse->export_gradient(emb);
    EXPECT_GT(nonzero(g), 0) << "step " << step;
    EXPECT_LT(nonzero(g), static_cast<std::int64_t>(g.size()) / 4) << "step " << step;
    // max_norm 0.05 clips: the clip factor comes from the norm, so it must be the same bits too.
    const double norm = dense->adamw_step(adam, 1e-3, 0.05);
    EXPECT_GT(norm, 0.05);
    EXPECT_EQ(sparse->adamw_step(adam, 1e-3, 0.05), norm) << "step " << step;
    expect_same_state(*dense, *sparse, "after AdamW");
    dense->zero_grad(), sparse->zero_grad();
    EXPECT_EQ(nonzero(sparse->export_gradient(emb)), 0) << "step " << step;
  }
}

// AdamW's deferred rows: rows no token wrote are caught up only when a forward reads them or the whole table is
// read. Eight steps with no export between them, over rows that go unread for several steps and are read again,
// with a ring of 3 steps (CudaOptions::deferred_embedding_steps) so that it wraps and forces whole catch-ups: every loss and
// norm, then every weight and moment and the sampler's greedy tokens, the same bits as updating every row.
TEST(CudaSparseEmbedding, DeferredRowsGiveTheSameBits) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = gpu_test::small_config();
  auto [dense, sparse] = dense_and_deferred(c);
  const std::int64_t batch = 2, seq = 64, n = batch * seq;
  std::mt19937 rng(31);
  AdamWOptions adam;
  const int first_rows[] = {0, 100, 200, 0, 300, 100, 0, 400};  // rows 0-59 unread for 2 steps, then 3
  for (int step = 0; step < 8; ++step) {
    const Columns x = columns_on_rows(rng, n, first_rows[step], 60, *c.mask_token_id);
    const CudaBatch b{batch, seq, false, x.ids, x.labels, {}, x.weights};
    EXPECT_EQ(sparse->forward_backward(b), dense->forward_backward(b)) << "step " << step;
    EXPECT_EQ(sparse->adamw_step(adam, 1e-2, 1.0), dense->adamw_step(adam, 1e-2, 1.0)) << "step " << step;
    dense->zero_grad(), sparse->zero_grad();
  }
  std::vector<std::int32_t> tokens[2];
  std::vector<float> confidence[2];
  const Columns x = columns_on_rows(rng, n, 0, 450, *c.mask_token_id);
  dense->greedy_tokens(batch, seq, false, x.ids, {}, tokens[0], confidence[0]);
  sparse->greedy_tokens(batch, seq, false, x.ids, {}, tokens[1], confidence[1]);
  EXPECT_EQ(tokens[1], tokens[0]);
  EXPECT_EQ(confidence[1], confidence[0]);
  expect_same_state(*dense, *sparse, "after 8 steps");
  // A resume's step count: every row is brought up to date first, and the next steps follow.
  dense->set_optimizer_steps(20), sparse->set_optimizer_steps(20);
  for (int step = 0; step < 2; ++step) {
    const Columns y = columns_on_rows(rng, n, 150 * step, 60, *c.mask_token_id);
    const CudaBatch b{batch, seq, false, y.ids, y.labels, {}, y.weights};
    EXPECT_EQ(sparse->forward_backward(b), dense->forward_backward(b)) << "resumed step " << step;
    EXPECT_EQ(sparse->adamw_step(adam, 1e-2, 1.0), dense->adamw_step(adam, 1e-2, 1.0)) << "resumed step " << step;
    dense->zero_grad(), sparse->zero_grad();
  }
  expect_same_state(*dense, *sparse, "after the resumed steps");
}

// The checkpoint exports (every tensor through the pinned host buffer) with the embedding's updates deferred: they
// must catch the rows up first and give the dense model's per-tensor exports bit for bit, also the second time,
// from the kept buffer after more steps.
TEST(CudaSparseEmbedding, CheckpointExportsAreThePerTensorExports) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = gpu_test::small_config();
  auto [dense, sparse] = dense_and_deferred(c);
  const std::int64_t batch = 2, seq = 64, n = batch * seq;
  std::mt19937 rng(41);
  for (int save = 0; save < 2; ++save) {
    for (int step = 0; step < 3 + 2 * save; ++step)
      step_both(*dense, *sparse, columns_on_rows(rng, n, 90 * step, 60, *c.mask_token_id), batch, seq);
    const auto weights = sparse->export_parameters();
    std::vector<std::vector<float>> m, v;
    sparse->export_moments(m, v);
    const auto& specs = dense->tensors();
    ASSERT_EQ(weights.size(), specs.size());
    ASSERT_EQ(m.size(), specs.size());
    ASSERT_EQ(v.size(), specs.size());
    for (std::size_t k = 0; k < specs.size(); ++k) {
      EXPECT_EQ(weights[k], dense->export_parameter(specs[k].name)) << "save " << save << ": " << specs[k].name;
      EXPECT_EQ(m[k], dense->export_exp_avg(specs[k].name)) << "save " << save << ": " << specs[k].name;
      EXPECT_EQ(v[k], dense->export_exp_avg_sq(specs[k].name)) << "save " << save << ": " << specs[k].name;
    }
  }
}

// The checkpoint state copy (state_copy.h) with the embedding's updates deferred: begin_state_copy() returns with
// the copies in flight and the next step enqueued right behind them; the copies are the state before that step (the
// per-tensor exports taken then) bit for bit, the step itself is the dense model's, and a second copy after more
// steps reuses the buffers.
TEST(CudaSparseEmbedding, StateCopyIsTheStateAtItsCallWhileTheNextStepRuns) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = gpu_test::small_config();
  auto [dense, sparse] = dense_and_deferred(c);
  const std::int64_t n = 2 * 64;
  std::mt19937 rng(43);
  const auto step = [&](int k) {
    step_both(*dense, *sparse, columns_on_rows(rng, n, 90 * (k % 3), 60, *c.mask_token_id), 2, 64);
  };
  const auto& specs = dense->tensors();
  for (int save = 0; save < 2; ++save) {
    for (int k = 0; k < 3 + 2 * save; ++k) step(k);
    std::vector<std::vector<float>> w, m, v;
    for (const auto& spec : specs) {
      w.push_back(dense->export_parameter(spec.name));
      m.push_back(dense->export_exp_avg(spec.name));
      v.push_back(dense->export_exp_avg_sq(spec.name));
    }
    sparse->begin_state_copy(true);
    step(7);  // enqueued while the copies may still run: its AdamW must wait for them on the device
    sparse->finish_state_copy();
    for (std::size_t k = 0; k < specs.size(); ++k) {
      const int p = static_cast<int>(k);
      const auto as_vector = [](std::span<const float> s) { return std::vector<float>(s.begin(), s.end()); };
      EXPECT_EQ(as_vector(sparse->copied_parameter(p)), w[k]) << "save " << save << ": " << specs[k].name;
      EXPECT_EQ(as_vector(sparse->copied_exp_avg(p)), m[k]) << "save " << save << ": " << specs[k].name;
      EXPECT_EQ(as_vector(sparse->copied_exp_avg_sq(p)), v[k]) << "save " << save << ": " << specs[k].name;
    }
    expect_same_state(*dense, *sparse, "after the step behind the copy");
  }
}

// Turned on between a backward and its update: every row counts as written until the next zero_grad, so the
// gradient accumulated so far is read whole; turned off again, the dense path reads whole rows again.
TEST(CudaSparseEmbedding, SwitchesKeepTheAccumulatedGradient) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = gpu_test::small_config();
  auto dense = deterministic_model(c), model = deterministic_model(c);
  const std::int64_t batch = 2, seq = 64, n = batch * seq;
  std::mt19937 rng(23);
  AdamWOptions adam;
  for (bool on : {true, false, true}) {
    const Columns x = columns_on_rows(rng, n, on ? 100 : 300, 50, *c.mask_token_id);
    const CudaBatch b{batch, seq, false, x.ids, x.labels, {}, x.weights};
    EXPECT_EQ(model->forward_backward(b), dense->forward_backward(b));
    model->set_sparse_embedding_grad(on);
    EXPECT_EQ(model->adamw_step(adam, 1e-3, 1.0), dense->adamw_step(adam, 1e-3, 1.0)) << on;
    expect_same_state(*dense, *model, on ? "turned on" : "turned off");
    dense->zero_grad(), model->zero_grad();
  }
}

TEST(CudaSparseEmbedding, RefusesATiedEmbedding) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  auto c = gpu_test::small_config();
  c.tie_word_embeddings = true;
  CudaModel model(c);
  EXPECT_THROW(model.set_sparse_embedding_grad(true), Error);
  EXPECT_FALSE(model.sparse_embedding_grad());
}

}  // namespace
}  // namespace dlm::train
