// MegaDLMs'/LLaDA's reverse process (the math is in include/dlm/train/sampler.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "sampling_math.h"

namespace dlm::train {

using detail::kGumbel;
using detail::kRandomConfidence;

KvCache parse_kv_cache(const std::string& name) {
  if (name == "none") return KvCache::kNone;
  if (name == "prefix") return KvCache::kPrefix;
  if (name == "dual") return KvCache::kDual;
  fail(fmt::format("--kv-cache: '{}' is not none, prefix or dual", name));
}

Remasking parse_remasking(const std::string& name) {
  if (name == "low_confidence") return Remasking::kLowConfidence;
  if (name == "random") return Remasking::kRandom;
  fail(fmt::format("--remasking: '{}' is not low_confidence or random", name));
}

std::vector<std::int64_t> transfer_counts(std::int64_t masked, std::int64_t steps) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(steps), masked / steps);
  for (std::int64_t i = 0; i < masked % steps; ++i) ++counts[static_cast<std::size_t>(i)];
  return counts;
}

void validate(const DiffusionSamplingOptions& o) {
  if (o.gen_length <= 0) fail(fmt::format("--max-new-tokens: {} must be positive", o.gen_length));
  if (o.block_length <= 0 || o.gen_length % o.block_length != 0)
    fail(fmt::format("--inference-block-size {} must divide --max-new-tokens {}", o.block_length, o.gen_length));
  const std::int64_t blocks = o.gen_length / o.block_length;
  if (o.steps <= 0 || o.steps % blocks != 0)
    fail(fmt::format("--sample-steps {} must be a positive multiple of the {} blocks", o.steps, blocks));
  if (o.mask_token < 0) fail("diffusion sampling needs the mask token (--mask-token or the config's mask_token_id)");
  if (o.temperature < 0) fail(fmt::format("--temperature: {} is negative", o.temperature));
  if (!(o.top_p > 0 && o.top_p <= 1)) fail(fmt::format("--top-p: {} is not in (0, 1]", o.top_p));
  if (o.cfg_scale < 0) fail(fmt::format("--cfg-scale: {} is negative", o.cfg_scale));
  if (!(o.confidence_threshold >= 0 && o.confidence_threshold < 1))
    fail(fmt::format("--threshold: {} is not in [0, 1)", o.confidence_threshold));
  if (o.cache_refresh < 0) fail(fmt::format("--cache-refresh: {} is negative", o.cache_refresh));
}

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// What a step's model call filled: logits of the columns [lo, hi) of each row ([rows, hi - lo, vocab]), or
// (greedy) the argmax and its probability per column ([rows, len], those of [lo, hi) read).
struct StepOutput {
  std::int64_t lo = 0, hi = 0;
  bool greedy = false;
  std::vector<float> logits;
  std::vector<std::int32_t> tokens;
  std::vector<float> confidence;
};
// Runs the model for step `step` of the block [begin, end) on x.
using StepFn = std::function<void(const SequenceBatch& x, std::int64_t begin, std::int64_t end, std::int64_t step,
                                  StepOutput& out)>;

// The logits of `x` from `run`; with guidance, those of x and of x with its prompt masked, combined.
void guided_logits(const LogitsFn& run, const SequenceBatch& x, const std::vector<std::uint8_t>& is_prompt,
                   const DiffusionSamplingOptions& o, std::vector<float>& logits) {
  if (o.cfg_scale <= 0) {
    run(x, logits);
    return;
  }
  SequenceBatch both = x;
  both.rows = 2 * x.rows;
  both.ids.insert(both.ids.end(), x.ids.begin(), x.ids.end());
  both.attention.insert(both.attention.end(), x.attention.begin(), x.attention.end());
  both.position_ids.insert(both.position_ids.end(), x.position_ids.begin(), x.position_ids.end());
  const std::size_t n = x.ids.size();
  for (std::size_t i = 0; i < n; ++i)
    if (is_prompt[i]) both.ids[n + i] = o.mask_token;
  std::vector<float> all;
  run(both, all);
  const std::size_t half = all.size() / 2;
  logits.resize(half);
  const auto w = static_cast<float>(o.cfg_scale);
  for (std::size_t i = 0; i < half; ++i) {
    // Equal values give themselves (bit for bit for finite ones): the padded vocabulary's -inf columns
    // stay -inf instead of -inf - -inf = NaN, which made every confidence NaN and decoded nothing.
    const float cond = all[i], uncond = all[half + i];
    logits[i] = cond == uncond ? cond : uncond + (w + 1.0f) * (cond - uncond);
  }
}

// The first column a step can change: `begin`, or an earlier one still masked (a prompt may hold masks).
std::int64_t first_open_column(const SequenceBatch& x, std::int32_t mask, std::int64_t begin) {
  std::int64_t first = begin;
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t j = 0; j < first; ++j) {
      const auto i = static_cast<std::size_t>(r * x.len + j);
      if (x.ids[i] == mask && x.attention[i]) {
        first = j;
        break;
      }
    }
  return first;
}

// The reverse process of sampler.h around `step_fn`, which gives each step's logits.
std::vector<std::vector<std::int32_t>> reverse_process(const StepFn& step_fn, std::int64_t vocab,
                                                       std::span<const std::vector<std::int32_t>> prompts,
                                                       const DiffusionSamplingOptions& o, std::int64_t* model_calls) {
  SequenceBatch x = detail::left_padded(prompts, o.gen_length, o.mask_token, o.pad_token);
  const std::int64_t rows = x.rows, len = x.len, prompt_len = len - o.gen_length;
  const CounterRng rng(o.seed);
  const std::int64_t blocks = o.gen_length / o.block_length, steps = o.steps / blocks;
  StepOutput m;
  std::uint64_t step_serial = 0;
  std::int64_t calls = 0;
  const bool parallel = o.confidence_threshold > 0;
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t begin = prompt_len + block * o.block_length, end = begin + o.block_length;
    std::vector<std::vector<std::int64_t>> counts;
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t masked = 0;
      for (std::int64_t j = begin; j < end; ++j) masked += x.ids[static_cast<std::size_t>(r * len + j)] == o.mask_token;
      counts.push_back(transfer_counts(masked, steps));
    }
    // Parallel decoding runs until the block has no mask left; it cannot need more than K steps.
    const std::int64_t max_steps = parallel ? o.block_length : steps;
    for (std::int64_t step = 0; step < max_steps; ++step, ++step_serial) {
      if (parallel) {
        bool any = false;
        for (std::int64_t r = 0; r < rows && !any; ++r)
          for (std::int64_t j = begin; j < end && !any; ++j) any = x.ids[static_cast<std::size_t>(r * len + j)] == o.mask_token;
        if (!any) break;
      }
      step_fn(x, begin, end, step, m);
      ++calls;
      const std::int64_t width = m.hi - m.lo;
      if (m.greedy && (m.tokens.size() != x.ids.size() || m.confidence.size() != x.ids.size()))
        fail(fmt::format("sampler: the model returned {} greedy tokens, expected {} x {}", m.tokens.size(), rows, len));
      if (!m.greedy && m.logits.size() != static_cast<std::size_t>(rows * width * vocab))
        fail(fmt::format("sampler: the model returned {} logits, expected {} x {} x {}", m.logits.size(), rows, width, vocab));
      if (!m.greedy) detail::require_no_nan(m.logits);
      std::vector<std::int32_t> x0(x.ids.size());
      std::vector<double> confidence(x.ids.size(), kNegInf);
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t j = m.lo; j < std::min(end, m.hi); ++j) {
          const auto i = static_cast<std::size_t>(r * len + j);
          if (x.ids[i] != o.mask_token || !x.attention[i]) continue;
          const std::uint64_t draw = (step_serial * static_cast<std::uint64_t>(rows) + static_cast<std::uint64_t>(r)) *
                                         static_cast<std::uint64_t>(len) + static_cast<std::uint64_t>(j);
          if (m.greedy) {
            x0[i] = m.tokens[i];
            confidence[i] = o.remasking == Remasking::kLowConfidence ? m.confidence[i]
                                                                     : rng.uniform(kRandomConfidence, draw, 0);
            continue;
          }
          const auto at = static_cast<std::size_t>(r * width + j - m.lo) * static_cast<std::size_t>(vocab);
          std::span<const float> row(m.logits.data() + at, static_cast<std::size_t>(vocab));
          std::vector<double> l(row.begin(), row.end());
          detail::top_p_filter(l, o.top_p);
          x0[i] = detail::gumbel_argmax(l, o.temperature, rng, kGumbel, draw);
          confidence[i] = o.remasking == Remasking::kLowConfidence ? detail::softmax64(row)[static_cast<std::size_t>(x0[i])]
                                                                   : rng.uniform(kRandomConfidence, draw, 0);
        }
        // The k most confident masked positions of the row (ties: lower position first).
        std::vector<std::int64_t> order(static_cast<std::size_t>(len));
        std::iota(order.begin(), order.end(), 0);
        const double* c = confidence.data() + r * len;
        std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return c[a] > c[b]; });
        const std::int64_t k = parallel ? len : counts[static_cast<std::size_t>(r)][static_cast<std::size_t>(step)];
        for (std::int64_t t = 0; t < k; ++t) {
          const auto i = static_cast<std::size_t>(r * len + order[static_cast<std::size_t>(t)]);
          if (confidence[i] == kNegInf) break;
          if (parallel && t > 0 && confidence[i] <= o.confidence_threshold) break;
          x.ids[i] = x0[i];
        }
      }
    }
  }
  if (model_calls) *model_calls = calls;
  std::vector<std::vector<std::int32_t>> out(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = prompt_len; j < len; ++j) {
      const auto id = x.ids[static_cast<std::size_t>(r * len + j)];
      if (o.eos && id == *o.eos) break;
      out[static_cast<std::size_t>(r)].push_back(id);
    }
  return out;
}

// Columns the prompt holds (prompt tokens, not padding): guidance masks them.
std::vector<std::uint8_t> prompt_columns(std::span<const std::vector<std::int32_t>> prompts,
                                         const DiffusionSamplingOptions& o) {
  const SequenceBatch x = detail::left_padded(prompts, o.gen_length, o.mask_token, o.pad_token);
  const std::int64_t prompt_len = x.len - o.gen_length;
  std::vector<std::uint8_t> is_prompt(x.ids.size(), 0);
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t j = 0; j < prompt_len; ++j)
      is_prompt[static_cast<std::size_t>(r * x.len + j)] = x.attention[static_cast<std::size_t>(r * x.len + j)];
  return is_prompt;
}

}  // namespace

std::vector<std::vector<std::int32_t>> diffusion_generate(const LogitsFn& model, std::int64_t vocab,
                                                          std::span<const std::vector<std::int32_t>> prompts,
                                                          const DiffusionSamplingOptions& o,
                                                          std::int64_t* model_calls, const GreedyFn& greedy) {
  validate(o);
  if (o.kv_cache != KvCache::kNone) fail("--kv-cache: this model keeps no keys and values (diffusion_generate_cached)");
  const std::vector<std::uint8_t> is_prompt = prompt_columns(prompts, o);
  const bool fast = greedy && o.temperature == 0 && o.cfg_scale <= 0;
  const StepFn step = [&](const SequenceBatch& x, std::int64_t begin, std::int64_t end, std::int64_t, StepOutput& m) {
    m.greedy = fast;
    if (fast) {
      // One window per block keeps the model's shapes (and the GPU's graphs) per block.
      m.lo = first_open_column(x, o.mask_token, begin);
      m.hi = end;
      greedy(x, m.lo, end, m.tokens, m.confidence);
      return;
    }
    m.lo = 0;
    m.hi = x.len;
    guided_logits(model, x, is_prompt, o, m.logits);
  };
  return reverse_process(step, vocab, prompts, o, model_calls);
}

std::vector<std::vector<std::int32_t>> diffusion_generate_cached(const CachedLogitsModel& model, std::int64_t vocab,
                                                                 std::span<const std::vector<std::int32_t>> prompts,
                                                                 const DiffusionSamplingOptions& o,
                                                                 std::int64_t* model_calls) {
  validate(o);
  if (o.kv_cache == KvCache::kNone) fail("diffusion_generate_cached: --kv-cache is none (use diffusion_generate)");
  if (!model.full || !model.window) fail("diffusion_generate_cached: the model has no cached forward");
  const std::vector<std::uint8_t> is_prompt = prompt_columns(prompts, o);
  const bool fast = model.full_greedy && model.window_greedy && o.temperature == 0 && o.cfg_scale <= 0;
  const StepFn step = [&](const SequenceBatch& x, std::int64_t begin, std::int64_t end, std::int64_t t, StepOutput& m) {
    m.greedy = fast;
    const bool refresh = o.cache_refresh > 0 ? t % o.cache_refresh == 0 : t == 0;
    if (fast) {
      // The columns read are those diffusion_generate's greedy step reads: [first open column, block end).
      m.lo = first_open_column(x, o.mask_token, begin);
      m.hi = end;
      if (refresh) model.full_greedy(x, m.lo, end, m.tokens, m.confidence);
      else model.window_greedy(x, m.lo, o.kv_cache == KvCache::kDual ? end : x.len, end, m.tokens, m.confidence);
      return;
    }
    if (refresh) {
      m.lo = 0;
      m.hi = x.len;
      guided_logits(model.full, x, is_prompt, o, m.logits);
      return;
    }
    m.lo = first_open_column(x, o.mask_token, begin);
    m.hi = o.kv_cache == KvCache::kDual ? end : x.len;
    const LogitsFn window = [&](const SequenceBatch& b, std::vector<float>& l) { model.window(b, m.lo, m.hi, l); };
    guided_logits(window, x, is_prompt, o, m.logits);
  };
  return reverse_process(step, vocab, prompts, o, model_calls);
}

}  // namespace dlm::train
