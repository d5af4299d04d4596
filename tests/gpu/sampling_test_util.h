// Helpers of the GPU sampling tests (the block KV cache, FP8 sampling): ids, logits columns, the samplers' batch
// of three padding groups, token agreement.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dlm/train/cuda_model.h"
#include "dlm/train/sampler.h"

namespace dlm::gpu_test {

// n token ids below the small model's mask token (499).
inline std::vector<std::int32_t> random_ids(std::mt19937& rng, std::int64_t n) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& t : ids) t = static_cast<std::int32_t>(rng() % 499);
  return ids;
}

// Columns [first, end) of each of `batch` rows of [batch * seq, vocab] logits.
inline std::vector<float> columns(const std::vector<float>& all, std::int64_t batch, std::int64_t seq,
                                  std::int64_t vocab, std::int64_t first, std::int64_t end) {
  std::vector<float> out;
  for (std::int64_t b = 0; b < batch; ++b)
    out.insert(out.end(), all.begin() + (b * seq + first) * vocab, all.begin() + (b * seq + end) * vocab);
  return out;
}

// Prompts of 5, 3 and 1 tokens: three padding groups, each run and stored apart.
inline std::vector<std::vector<std::int32_t>> three_prompts() { return {{11, 12, 13, 14, 15}, {21, 22, 23}, {31}}; }

// 24 new tokens in blocks of 8, a step a token, greedy, the small model's mask (499), with the cache's mode.
inline train::DiffusionSamplingOptions sampling_options(train::KvCache mode, std::int64_t refresh) {
  train::DiffusionSamplingOptions o;
  o.gen_length = 24, o.block_length = 8, o.steps = 24;
  o.mask_token = 499, o.pad_token = 0, o.seed = 5;
  o.kv_cache = mode, o.cache_refresh = refresh;
  return o;
}

// The share of positions where a and b hold the same token (a position only one has counts as different).
inline double agreement(const std::vector<std::vector<std::int32_t>>& a,
                        const std::vector<std::vector<std::int32_t>>& b) {
  std::size_t same = 0, all = 0;
  for (std::size_t r = 0; r < a.size(); ++r)
    for (std::size_t j = 0; j < std::max(a[r].size(), b[r].size()); ++j, ++all)
      same += j < a[r].size() && j < b[r].size() && a[r][j] == b[r][j];
  return all ? double(same) / double(all) : 1.0;
}

// A graphed model `a` and an eager model `e` (the same weights and GEMM algorithms: deterministic options) give the
// same greedy tokens and confidences bit for bit over `ids` [batch, seq] at blocks of `width` columns at 0, 8, 24,
// 16 (three rounds: calls eager, captured, replayed), for the exact forward, the storing forward (into store 1) and
// the dual cache's window over store 0 (which the caller filled). Each block's columns as a step finds them: some
// decoded since the store was filled, the rest masks (499).
inline void expect_graphs_replay_eager(train::CudaModel& a, train::CudaModel& e, const std::vector<std::int32_t>& ids,
                                       std::int64_t batch, std::int64_t seq, std::int64_t width, std::mt19937& rng,
                                       const std::string& when = "") {
  using Mode = train::KvCacheUse::Mode;
  std::vector<std::int32_t> tokens_a, tokens_e;
  std::vector<float> confidence_a, confidence_e;
  for (const Mode mode : {Mode::kNone, Mode::kStore, Mode::kWindow})
    for (int round = 0; round < 3; ++round)
      for (std::int64_t first : {0, 8, 24, 16}) {
        auto x = ids;
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t j = first; j < first + width; ++j)
            x[static_cast<std::size_t>(b * seq + j)] = rng() % 3 == 0 ? static_cast<std::int32_t>(rng() % 499) : 499;
        const train::ColumnWindow w{first, first + width};
        const train::KvCacheUse kv = mode == Mode::kWindow ? train::KvCacheUse{mode, 0, w} : train::KvCacheUse{mode, 1, {}};
        a.greedy_tokens(batch, seq, false, x, {}, tokens_a, confidence_a, w, kv);
        e.greedy_tokens(batch, seq, false, x, {}, tokens_e, confidence_e, w, kv);
        const std::string at = when + "mode " + std::to_string(int(mode)) + " round " + std::to_string(round) +
                               " block at " + std::to_string(first);
        EXPECT_EQ(tokens_a, tokens_e) << at;
        EXPECT_EQ(confidence_a, confidence_e) << at;
      }
}

}  // namespace dlm::gpu_test
