#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/sampler.h"

namespace dlm::train {
namespace {

constexpr std::int64_t kVocab = 8;
constexpr std::int32_t kMask = 7;

// A model that prefers token (position % 5) at every position, more strongly further right,
// so low-confidence remasking decodes right to left within a block.
void toy_model(const SequenceBatch& b, std::vector<float>& logits) {
  logits.assign(static_cast<std::size_t>(b.rows * b.len * kVocab), 0.0f);
  for (std::int64_t i = 0; i < b.rows * b.len; ++i) {
    const auto pos = b.position_ids[static_cast<std::size_t>(i)];
    logits[static_cast<std::size_t>(i * kVocab + pos % 5)] = 1.0f + 0.5f * static_cast<float>(pos);
  }
}

// 8 new tokens in 4 steps, blocks of 4: two blocks of two steps each.
DiffusionSamplingOptions two_blocks_of_four() {
  DiffusionSamplingOptions o;
  o.gen_length = 8;
  o.steps = 4;
  o.block_length = 4;
  o.mask_token = kMask;
  return o;
}

TEST(TransferCounts, SplitsTheRemainderFirst) {
  EXPECT_EQ(transfer_counts(10, 4), (std::vector<std::int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(transfer_counts(4, 4), (std::vector<std::int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(transfer_counts(2, 4), (std::vector<std::int64_t>{1, 1, 0, 0}));
}

TEST(DiffusionSampler, GreedyDecodesTheModelsArgmax) {
  DiffusionSamplingOptions o = two_blocks_of_four();
  std::vector<std::vector<std::int32_t>> prompts = {{1, 2, 3}, {4}};
  int calls = 0;
  LogitsFn model = [&](const SequenceBatch& b, std::vector<float>& l) {
    ++calls;
    EXPECT_EQ(b.len, 11);
    EXPECT_EQ(b.attention[11], 0);  // row 1 is left-padded by two
    EXPECT_EQ(b.position_ids[11 + 2], 0);
    toy_model(b, l);
  };
  auto out = diffusion_generate(model, kVocab, prompts, o);
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(out[0], (std::vector<std::int32_t>{3, 4, 0, 1, 2, 3, 4, 0}));
  EXPECT_EQ(out[1], (std::vector<std::int32_t>{1, 2, 3, 4, 0, 1, 2, 3}));
}

// The toy's greedy tokens and confidences of the columns [first, end); garbage elsewhere (a model skips
// those rows).
void toy_greedy(const SequenceBatch& b, std::int64_t first, std::int64_t end, std::vector<std::int32_t>& tokens,
                std::vector<float>& confidence) {
  std::vector<float> logits;
  toy_model(b, logits);
  tokens.assign(static_cast<std::size_t>(b.rows * b.len), 5);
  confidence.assign(tokens.size(), 2.0f);
  for (std::int64_t r = 0; r < b.rows; ++r)
    for (std::int64_t j = first; j < end; ++j) {
      const auto i = static_cast<std::size_t>(r * b.len + j);
      const float* row = logits.data() + i * kVocab;
      const auto best = std::max_element(row, row + kVocab) - row;
      double sum = 0;
      for (std::int64_t v = 0; v < kVocab; ++v) sum += std::exp(double(row[v]) - row[best]);
      tokens[i] = static_cast<std::int32_t>(best);
      confidence[i] = static_cast<float>(1.0 / sum);
    }
}

// The greedy fast path is asked for the columns a step can change: the block, widened left to a masked
// prompt column while one is left. Outside that window it gets garbage back and must give the logits
// path's output.
TEST(DiffusionSampler, GreedyPathReadsOnlyTheWindowItAsksFor) {
  DiffusionSamplingOptions o = two_blocks_of_four();
  const std::vector<std::vector<std::int32_t>> prompts = {{1, kMask, 3}, {4}};
  std::vector<std::pair<std::int64_t, std::int64_t>> windows;
  GreedyFn greedy = [&](const SequenceBatch& b, std::int64_t first, std::int64_t end, std::vector<std::int32_t>& tokens,
                        std::vector<float>& confidence) {
    windows.emplace_back(first, end);
    toy_greedy(b, first, end, tokens, confidence);
  };
  const auto fast = diffusion_generate(toy_model, kVocab, prompts, o, nullptr, greedy);
  const auto slow = diffusion_generate(toy_model, kVocab, prompts, o);
  EXPECT_EQ(fast, slow);
  // Blocks are columns [3, 7) and [7, 11). The prompt's mask (column 1) competes with the block's masks
  // in every step and, the toy being less sure further left, is never the most confident: every window
  // starts at column 1.
  const std::vector<std::pair<std::int64_t, std::int64_t>> want = {{1, 7}, {1, 7}, {1, 11}, {1, 11}};
  EXPECT_EQ(windows, want);
  EXPECT_EQ(fast[0].size(), 8u);
  // Without a masked prompt column the window is the block.
  windows.clear();
  const std::vector<std::vector<std::int32_t>> plain = {{1, 2, 3}, {4}};
  EXPECT_EQ(diffusion_generate(toy_model, kVocab, plain, o, nullptr, greedy), diffusion_generate(toy_model, kVocab, plain, o));
  const std::vector<std::pair<std::int64_t, std::int64_t>> blocks = {{3, 7}, {3, 7}, {7, 11}, {7, 11}};
  EXPECT_EQ(windows, blocks);
}

// A model with the block KV cache that records its calls: "full" or "window [first, end)", and the ids of
// the block [begin, begin + 4) each full call saw. Its logits are the toy's (they depend on positions
// only), so every schedule decodes the same tokens.
struct RecordingCache {
  std::vector<std::string> calls;
  std::vector<std::vector<std::int32_t>> full_ids;  // row 0's ids at each full call
  CachedLogitsModel model() {
    CachedLogitsModel m;
    m.full = [this](const SequenceBatch& b, std::vector<float>& l) {
      calls.push_back("full");
      full_ids.emplace_back(b.ids.begin(), b.ids.begin() + b.len);
      toy_model(b, l);
    };
    m.window = [this](const SequenceBatch& b, std::int64_t first, std::int64_t end, std::vector<float>& l) {
      calls.push_back(fmt::format("window [{}, {})", first, end));
      std::vector<float> all;
      toy_model(b, all);
      l.clear();
      for (std::int64_t r = 0; r < b.rows; ++r)
        l.insert(l.end(), all.begin() + (r * b.len + first) * kVocab, all.begin() + (r * b.len + end) * kVocab);
    };
    return m;
  }
};

// Blocks [3, 7) and [7, 11) of a sequence of 11: each block starts with a full forward that sees the
// previous block decoded (no key or value is kept across a block boundary); prefix windows run to the end,
// dual windows to the block's end; --cache-refresh R adds a full forward every R steps of a block.
TEST(DiffusionSampler, CacheRefreshesAtEveryBlockStartAndEveryRSteps) {
  DiffusionSamplingOptions o = two_blocks_of_four();
  o.steps = 8;  // four steps per block
  const std::vector<std::vector<std::int32_t>> prompts = {{1, 2, 3}, {4}};
  const auto exact = diffusion_generate(toy_model, kVocab, prompts, o);
  struct Want {
    KvCache mode;
    std::int64_t refresh;
    std::vector<std::string> calls;
  };
  const std::vector<Want> cases = {
      {KvCache::kPrefix, 0, {"full", "window [3, 11)", "window [3, 11)", "window [3, 11)",  //
                             "full", "window [7, 11)", "window [7, 11)", "window [7, 11)"}},
      {KvCache::kDual, 0, {"full", "window [3, 7)", "window [3, 7)", "window [3, 7)",  //
                           "full", "window [7, 11)", "window [7, 11)", "window [7, 11)"}},
      {KvCache::kDual, 2, {"full", "window [3, 7)", "full", "window [3, 7)",  //
                           "full", "window [7, 11)", "full", "window [7, 11)"}},
      {KvCache::kPrefix, 1, std::vector<std::string>(8, "full")},
  };
  for (const auto& want : cases) {
    RecordingCache rec;
    o.kv_cache = want.mode;
    o.cache_refresh = want.refresh;
    std::int64_t calls = 0;
    EXPECT_EQ(diffusion_generate_cached(rec.model(), kVocab, prompts, o, &calls), exact);
    EXPECT_EQ(rec.calls, want.calls);
    EXPECT_EQ(calls, 8);
    // The full call opening block 1 (the first full call after step 3) sees block 0 without a mask.
    const std::size_t opening = want.refresh == 0 ? 1 : want.refresh == 2 ? 2 : 4;
    ASSERT_GT(rec.full_ids.size(), opening);
    for (std::int64_t j = 3; j < 7; ++j) EXPECT_NE(rec.full_ids[opening][static_cast<std::size_t>(j)], kMask);
    for (std::int64_t j = 7; j < 11; ++j) EXPECT_EQ(rec.full_ids[opening][static_cast<std::size_t>(j)], kMask);
  }
}

// A masked prompt column can still be unmasked, as in the exact sampler: windows start at it while it is
// masked. Parallel decoding ends a block early, and the next block still opens with a full forward.
TEST(DiffusionSampler, CachedWindowsReachBackToMaskedPromptColumns) {
  DiffusionSamplingOptions o = two_blocks_of_four(), exact = o;
  o.kv_cache = KvCache::kDual;
  const std::vector<std::vector<std::int32_t>> prompts = {{1, kMask, 3}, {4}};
  RecordingCache rec;
  EXPECT_EQ(diffusion_generate_cached(rec.model(), kVocab, prompts, o), diffusion_generate(toy_model, kVocab, prompts, exact));
  EXPECT_EQ(rec.calls, (std::vector<std::string>{"full", "window [1, 7)", "full", "window [1, 11)"}));
  o.confidence_threshold = exact.confidence_threshold = 0.6;
  rec.calls.clear();
  EXPECT_EQ(diffusion_generate_cached(rec.model(), kVocab, prompts, o), diffusion_generate(toy_model, kVocab, prompts, exact));
  EXPECT_EQ(rec.calls.front(), "full");
  EXPECT_EQ(std::count(rec.calls.begin(), rec.calls.end(), "full"), 2);
}

// The cached sampler's greedy fast path (temperature 0, no guidance): a refresh reads the greedy tokens of
// [first open column, block end), a window runs [that column, len) (prefix) or [.., block end) (dual) and reads
// the same columns; the tokens are the exact sampler's (the toy's logits do not depend on the cache).
TEST(DiffusionSampler, CachedGreedyPathRunsTheWindowAndReadsTheBlock) {
  DiffusionSamplingOptions o = two_blocks_of_four(), exact = o;
  const std::vector<std::vector<std::int32_t>> prompts = {{1, kMask, 3}, {4}};
  for (KvCache mode : {KvCache::kPrefix, KvCache::kDual}) {
    RecordingCache rec;
    CachedLogitsModel m = rec.model();
    m.full_greedy = [&](const SequenceBatch& b, std::int64_t first, std::int64_t end, std::vector<std::int32_t>& tokens,
                        std::vector<float>& confidence) {
      rec.calls.push_back(fmt::format("full greedy [{}, {})", first, end));
      toy_greedy(b, first, end, tokens, confidence);
    };
    m.window_greedy = [&](const SequenceBatch& b, std::int64_t first, std::int64_t end, std::int64_t read_end,
                          std::vector<std::int32_t>& tokens, std::vector<float>& confidence) {
      rec.calls.push_back(fmt::format("window greedy [{}, {}) read to {}", first, end, read_end));
      toy_greedy(b, first, read_end, tokens, confidence);
    };
    o.kv_cache = mode;
    EXPECT_EQ(diffusion_generate_cached(m, kVocab, prompts, o), diffusion_generate(toy_model, kVocab, prompts, exact));
    const std::string to = mode == KvCache::kDual ? "7" : "11";
    EXPECT_EQ(rec.calls, (std::vector<std::string>{"full greedy [1, 7)", "window greedy [1, " + to + ") read to 7",
                                                   "full greedy [1, 11)", "window greedy [1, 11) read to 11"}));
  }
  // With a temperature the logits path runs.
  o.temperature = 1;
  RecordingCache rec;
  CachedLogitsModel m = rec.model();
  m.full_greedy = [](const SequenceBatch&, std::int64_t, std::int64_t, std::vector<std::int32_t>&,
                     std::vector<float>&) { FAIL() << "greedy path at temperature 1"; };
  m.window_greedy = [](const SequenceBatch&, std::int64_t, std::int64_t, std::int64_t, std::vector<std::int32_t>&,
                       std::vector<float>&) { FAIL() << "greedy path at temperature 1"; };
  diffusion_generate_cached(m, kVocab, prompts, o);
  EXPECT_EQ(rec.calls.front(), "full");
}

TEST(DiffusionSampler, KvCacheOptionsAreChecked) {
  DiffusionSamplingOptions o = two_blocks_of_four();
  const std::vector<std::vector<std::int32_t>> prompts = {{1}};
  RecordingCache rec;
  EXPECT_THROW(diffusion_generate_cached(rec.model(), kVocab, prompts, o), Error);  // kv_cache none
  o.kv_cache = KvCache::kPrefix;
  EXPECT_THROW(diffusion_generate(toy_model, kVocab, prompts, o), Error);  // no cache behind a LogitsFn
  o.cache_refresh = -1;
  EXPECT_THROW(validate(o), Error);
  EXPECT_EQ(parse_kv_cache("dual"), KvCache::kDual);
  EXPECT_THROW(parse_kv_cache("suffix"), Error);
}

TEST(DiffusionSampler, StopsAtEosAndIsDeterministicPerSeed) {
  DiffusionSamplingOptions o;
  o.gen_length = 8;
  o.steps = 8;
  o.block_length = 4;
  o.mask_token = kMask;
  o.eos = 0;
  o.temperature = 1.0;
  o.remasking = Remasking::kRandom;
  o.seed = 3;
  std::vector<std::vector<std::int32_t>> prompts = {{1, 2}};
  auto a = diffusion_generate(toy_model, kVocab, prompts, o);
  auto b = diffusion_generate(toy_model, kVocab, prompts, o);
  EXPECT_EQ(a, b);
  for (auto id : a[0]) EXPECT_NE(id, 0);
  o.temperature = 0;
  auto greedy = diffusion_generate(toy_model, kVocab, prompts, o);
  EXPECT_EQ(greedy[0], (std::vector<std::int32_t>{2, 3, 4}));  // cut before position 5's eos (id 0)
}

TEST(DiffusionSampler, ParallelDecodingUnmasksConfidentPositionsTogether) {
  DiffusionSamplingOptions o;
  o.gen_length = 8;
  o.steps = 8;
  o.block_length = 4;
  o.mask_token = kMask;
  std::vector<std::vector<std::int32_t>> prompts = {{1, 2, 3}};
  std::int64_t calls = 0;
  auto slow = diffusion_generate(toy_model, kVocab, prompts, o, &calls);
  EXPECT_EQ(calls, 8);
  // softmax of the toy logits at x0 is e^a / (e^a + 7) with a = 1 + pos / 2: above 0.6 from position 4 on.
  o.confidence_threshold = 0.6;
  auto fast = diffusion_generate(toy_model, kVocab, prompts, o, &calls);
  EXPECT_EQ(fast, slow);  // the toy model's argmax does not depend on the context
  EXPECT_EQ(calls, 2);    // one step per block
  o.confidence_threshold = 0.99;  // nothing that confident: the most confident position per step
  diffusion_generate(toy_model, kVocab, prompts, o, &calls);
  EXPECT_EQ(calls, 8);
}

// The model's padded vocabulary columns are -inf (make_logits_fn); guidance must keep them -inf, not
// turn -inf - -inf into NaN confidences that decode nothing.
TEST(DiffusionSampler, GuidanceKeepsPaddedVocabularyColumnsOut) {
  DiffusionSamplingOptions o = two_blocks_of_four();
  o.cfg_scale = 1.5;
  LogitsFn padded = [](const SequenceBatch& b, std::vector<float>& l) {
    toy_model(b, l);
    for (std::int64_t i = 0; i < b.rows * b.len; ++i) l[static_cast<std::size_t>(i * kVocab + 6)] = -INFINITY;
  };
  const std::vector<std::vector<std::int32_t>> prompts = {{1, 2, 3}};
  const auto out = diffusion_generate(padded, kVocab, prompts, o);
  EXPECT_EQ(out[0], (std::vector<std::int32_t>{3, 4, 0, 1, 2, 3, 4, 0}));
}

TEST(DiffusionSampler, RejectsBadShapes) {
  DiffusionSamplingOptions o;
  o.mask_token = kMask;
  o.gen_length = 10;
  o.block_length = 4;
  EXPECT_THROW(validate(o), Error);
  o.block_length = 5;
  o.steps = 3;
  EXPECT_THROW(validate(o), Error);
  o.steps = 4;
  EXPECT_NO_THROW(validate(o));
  o.mask_token = -1;
  EXPECT_THROW(validate(o), Error);
}

TEST(ArSampler, GreedyFollowsTheArgmaxAndStopsAtEos) {
  ArSamplingOptions o;
  o.max_new_tokens = 10;
  o.temperature = 0;
  o.eos = 0;
  std::vector<std::vector<std::int32_t>> prompts = {{6, 6}};
  auto out = ar_generate(toy_model, kVocab, prompts, o);
  // The last position p predicts p % 5: prompt positions 0,1 -> 1, then 2, 3, 4, then 0 = eos.
  EXPECT_EQ(out[0], (std::vector<std::int32_t>{1, 2, 3, 4}));
  o.temperature = 1.0;
  o.top_k = 1;  // top-1 is greedy whatever the temperature
  EXPECT_EQ(ar_generate(toy_model, kVocab, prompts, o)[0], out[0]);
}

}  // namespace
}  // namespace dlm::train
