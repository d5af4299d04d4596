// The sampling KV cache of the CPU model (Model::forward_storing_kv / forward_window) and the cached
// diffusion sampler on it: a window right after storing is the full forward's rows, bit for bit; the store
// follows every storing forward and no window; refresh every step is the exact sampler, for greedy,
// stochastic, guided and parallel decoding over prompts of different lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dlm/common/error.h"
#include "dlm/train/model.h"
#include "dlm/train/model_adapters.h"
#include "../mpi/tiny_training.h"

namespace dlm::train {
namespace {

constexpr std::int32_t kMask = 12;

// The MPI tests' bidirectional model (QK-norm, 4 heads over 2 KV groups), with weights large enough that
// every nonlinearity matters.
ckpt::ModelConfig diffusion_config(int layers) {
  ckpt::ModelConfig c = test::tiny_model(layers, 13, false);
  c.init_method_std = 0.5;
  return c;
}

// Two rows of 10 columns, the second left-padded by three, position ids cumsum(attention) - 1.
struct Inputs {
  std::vector<std::int32_t> ids = {3, 1, 4, 1, 5, 9, kMask, kMask, kMask, kMask,  //
                                   0, 0, 0, 2, 7, 1, kMask, kMask, kMask, kMask};
  std::vector<std::uint8_t> valid = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
  std::vector<std::int32_t> positions = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6};
  ModelInput input() const { return {2, 10, ids, positions, valid, AttentionKind::kBidirectional, {}}; }
};

std::vector<float> host(Model& m, const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  m.backend().copy_to_host(t, out);
  return out;
}

// The rows of columns [first, end) of each of the 2 x 10 rows of `full` ([20, width]).
std::vector<float> window_rows(const std::vector<float>& full, std::int64_t width, std::int64_t first, std::int64_t end) {
  std::vector<float> out;
  for (std::int64_t b = 0; b < 2; ++b)
    out.insert(out.end(), full.begin() + (b * 10 + first) * width, full.begin() + (b * 10 + end) * width);
  return out;
}

// The largest |a - b| / max(1, |b|): a window's GEMMs have fewer rows than the full forward's, and
// OpenBLAS picks its kernel (and so its summation order) by shape, so equal math differs in the last bits.
double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / std::max(1.0, std::abs(double(b[i]))));
  return worst;
}
constexpr double kSameMath = 1e-5;

class ModelKvCache : public ::testing::Test {
 protected:
  ModelKvCache() : be_(make_cpu_backend(2)) {}
  std::unique_ptr<Model> model(int layers) {
    auto m = std::make_unique<Model>(diffusion_config(layers), *be_);
    m->init(11);
    return m;
  }
  std::unique_ptr<Backend> be_;
};

TEST_F(ModelKvCache, AWindowRightAfterStoringIsTheFullForwardsRows) {
  auto m = model(2);
  const Inputs x;
  const std::int64_t w = m->config().padded_vocab_size();
  const auto full = host(*m, m->forward(x.input()));
  EXPECT_EQ(host(*m, m->forward_storing_kv(x.input())), full);
  for (auto [first, end] : {std::pair<std::int64_t, std::int64_t>{6, 10}, {6, 8}, {2, 10}, {0, 10}, {9, 10}})
    EXPECT_LT(max_difference(host(*m, m->forward_window(x.input(), first, end)), window_rows(full, w, first, end)),
              kSameMath)
        << "window [" << first << ", " << end << ")";
  // The same shape as the full forward: the same GEMMs, bit for bit.
  EXPECT_EQ(host(*m, m->forward_window(x.input(), 0, 10)), full);
}

// One layer: a column's keys and values depend on its own id only, so a window over the changed columns
// with the others stored is the full forward of the new ids. Two layers: the stored keys of layer 1 saw the
// old ids, so the window is not the full forward (the approximation the sampler makes).
TEST_F(ModelKvCache, AWindowRecomputesItsColumnsFromTheCurrentIds) {
  Inputs x;
  Inputs y = x;
  y.ids[6] = 2;
  y.ids[17] = 5;
  for (int layers : {1, 2}) {
    auto m = model(layers);
    const std::int64_t w = m->config().padded_vocab_size();
    const auto full_y = host(*m, m->forward(y.input()));
    m->forward_storing_kv(x.input());
    const auto window = host(*m, m->forward_window(y.input(), 6, 9));
    const double difference = max_difference(window, window_rows(full_y, w, 6, 9));
    if (layers == 1) {
      EXPECT_LT(difference, kSameMath);
    } else {
      EXPECT_GT(difference, 1e-3);
    }
  }
}

// What a block boundary relies on: each storing forward replaces the store; a window leaves it as it was.
TEST_F(ModelKvCache, EveryStoringForwardReplacesTheStoreAndWindowsKeepIt) {
  auto m = model(2);
  const std::int64_t w = m->config().padded_vocab_size();
  Inputs x, y;
  for (std::int64_t j : {6, 7, 8, 9}) y.ids[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
  const auto full_x = host(*m, m->forward(x.input())), full_y = host(*m, m->forward(y.input()));
  m->forward_storing_kv(x.input());
  m->forward_storing_kv(y.input());
  EXPECT_LT(max_difference(host(*m, m->forward_window(y.input(), 8, 10)), window_rows(full_y, w, 8, 10)), kSameMath);
  m->forward_storing_kv(x.input());
  m->forward_window(y.input(), 6, 10);
  EXPECT_LT(max_difference(host(*m, m->forward_window(x.input(), 8, 10)), window_rows(full_x, w, 8, 10)), kSameMath);
  // A stale store shows: the window of y's ids over x's keys is not y's full forward.
  m->forward_storing_kv(x.input());
  EXPECT_GT(max_difference(host(*m, m->forward_window(y.input(), 8, 10)), window_rows(full_y, w, 8, 10)), 1e-3);
  // The window's activations live in their own slot: the full forward's logits of slot 0 are untouched.
  const Tensor& stored = m->forward_storing_kv(x.input());
  m->forward_window(y.input(), 6, 8);
  EXPECT_EQ(host(*m, stored), full_x);
}

TEST_F(ModelKvCache, MisuseIsAnErrorNamingIt) {
  auto m = model(1);
  const Inputs x;
  EXPECT_THROW(m->forward_window(x.input(), 6, 10), Error);  // nothing stored
  m->forward_storing_kv(x.input());
  EXPECT_THROW(m->forward_window(x.input(), 6, 11), Error);
  EXPECT_THROW(m->forward_window(x.input(), 6, 6), Error);
  ModelInput shorter = x.input();
  shorter.batch = 1;
  shorter.ids = shorter.ids.subspan(0, 10);
  shorter.positions = shorter.positions.subspan(0, 10);
  shorter.key_valid = shorter.key_valid.subspan(0, 10);
  try {
    m->forward_window(shorter, 6, 10);
    FAIL() << "a window of another batch shape accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "model: a window of a batch 1 x 10, but the stored keys are of 2 x 10");
  }
  ModelInput causal = x.input();
  causal.attention = AttentionKind::kCausal;
  EXPECT_THROW(m->forward_storing_kv(causal), Error);
}

// Prompts of three lengths (left padding of 0, 2 and 4), 8 new tokens in blocks of 4.
DiffusionSamplingOptions sampling(double temperature, KvCache mode) {
  DiffusionSamplingOptions o;
  o.gen_length = o.steps = 8;
  o.block_length = 4;
  o.temperature = temperature;
  o.mask_token = kMask;
  o.seed = 5;
  o.kv_cache = mode;
  return o;
}

const std::vector<std::vector<std::int32_t>> kPrompts = {{3, 1, 4, 1, 5}, {9, 2, 6}, {5}};

struct Case {
  const char* name;
  double temperature, top_p, cfg, threshold;
  Remasking remasking;
};

class CachedSampler : public ModelKvCache, public ::testing::WithParamInterface<Case> {};

TEST_P(CachedSampler, RefreshEveryStepIsTheExactSampler) {
  const Case c = GetParam();
  auto m = model(2);
  const std::int64_t vocab = m->config().padded_vocab_size();
  for (KvCache mode : {KvCache::kPrefix, KvCache::kDual}) {
    DiffusionSamplingOptions o = sampling(c.temperature, KvCache::kNone);
    o.top_p = c.top_p;
    o.cfg_scale = c.cfg;
    o.confidence_threshold = c.threshold;
    o.remasking = c.remasking;
    std::int64_t exact_calls = 0, cached_calls = 0;
    const auto exact = diffusion_generate(make_logits_fn(*m), vocab, kPrompts, o, &exact_calls);
    o.kv_cache = mode;
    o.cache_refresh = 1;
    const auto cached = diffusion_generate_cached(make_cached_logits_model(*m), vocab, kPrompts, o, &cached_calls);
    EXPECT_EQ(cached, exact);
    EXPECT_EQ(cached_calls, exact_calls);
    ASSERT_EQ(exact.size(), 3u);
    EXPECT_EQ(exact[0].size(), 8u);  // no eos: every new token is returned
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sampling, CachedSampler,
    ::testing::Values(Case{"greedy", 0, 1, 0, 0, Remasking::kLowConfidence},
                      Case{"temperature_top_p", 0.8, 0.9, 0, 0, Remasking::kLowConfidence},
                      Case{"random_remasking", 1.0, 1, 0, 0, Remasking::kRandom},
                      Case{"guidance", 0.5, 1, 0.7, 0, Remasking::kLowConfidence},
                      Case{"parallel", 0, 1, 0, 0.2, Remasking::kLowConfidence}),
    [](const auto& info) { return std::string(info.param.name); });

// Between refreshes the cached sampler decodes from window logits: with the store refreshed only at the
// blocks' starts, a model of one layer (whose stored keys of the unchanged columns are exact) gives the
// exact sampler's tokens in both modes (each window holds every column that changes).
TEST_F(ModelKvCache, BlockRefreshDecodesFromWindows) {
  for (int layers : {1, 2}) {
    auto m = model(layers);
    const std::int64_t vocab = m->config().padded_vocab_size();
    const auto exact = diffusion_generate(make_logits_fn(*m), vocab, kPrompts, sampling(0, KvCache::kNone));
    for (KvCache mode : {KvCache::kPrefix, KvCache::kDual}) {
      std::int64_t calls = 0;
      const auto cached =
          diffusion_generate_cached(make_cached_logits_model(*m), vocab, kPrompts, sampling(0, mode), &calls);
      EXPECT_EQ(calls, 8);
      for (const auto& row : cached) EXPECT_EQ(row.size(), 8u);
      if (layers == 1) {
        EXPECT_EQ(cached, exact);
      }
    }
  }
}

}  // namespace
}  // namespace dlm::train
