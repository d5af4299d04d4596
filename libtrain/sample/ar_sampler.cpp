// Autoregressive sampling: temperature, top-k, top-p, eos stop (the math is in sampler.h).
#include <fmt/format.h>

#include "dlm/common/error.h"
#include "sampling_math.h"

namespace dlm::train {

std::vector<std::vector<std::int32_t>> ar_generate(const LogitsFn& model, std::int64_t vocab,
                                                   std::span<const std::vector<std::int32_t>> prompts,
                                                   const ArSamplingOptions& o) {
  if (o.max_new_tokens <= 0) fail(fmt::format("--max-new-tokens: {} must be positive", o.max_new_tokens));
  if (o.temperature < 0) fail(fmt::format("--temperature: {} is negative", o.temperature));
  if (!(o.top_p > 0 && o.top_p <= 1)) fail(fmt::format("--top-p: {} is not in (0, 1]", o.top_p));
  for (const auto& p : prompts)
    if (p.empty()) fail("AR sampling needs a non-empty prompt (a bos token at least)");
  SequenceBatch x = detail::left_padded(prompts, 0, o.pad_token, o.pad_token);
  const auto rows = static_cast<std::size_t>(x.rows);
  std::vector<std::vector<std::int32_t>> out(rows);
  std::vector<bool> done(rows, false);
  const CounterRng rng(o.seed);
  std::vector<float> logits;
  for (std::int64_t step = 0; step < o.max_new_tokens; ++step) {
    model(x, logits);
    if (logits.size() != static_cast<std::size_t>(x.rows * x.len * vocab))
      fail(fmt::format("sampler: the model returned {} logits, expected {} x {} x {}", logits.size(), x.rows, x.len, vocab));
    detail::require_no_nan(logits);
    SequenceBatch next;
    next.rows = x.rows;
    next.len = x.len + 1;
    bool all_done = true;
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t last = r * static_cast<std::size_t>(x.len) + static_cast<std::size_t>(x.len - 1);
      const float* row = logits.data() + last * static_cast<std::size_t>(vocab);
      std::vector<double> l(row, row + vocab);
      std::int32_t id = o.pad_token;
      if (!done[r]) {
        if (o.temperature > 0)
          for (double& v : l) v /= o.temperature;
        detail::top_k_filter(l, o.top_k);
        detail::top_p_filter(l, o.top_p);
        const std::uint64_t draw = static_cast<std::uint64_t>(step) * rows + r;
        id = detail::gumbel_argmax(l, o.temperature > 0 ? 1.0 : 0.0, rng, detail::kGumbel, draw);
        if (o.eos && id == *o.eos) done[r] = true;
        else out[r].push_back(id);
      }
      all_done = all_done && done[r];
      const auto begin = x.ids.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(x.len));
      next.ids.insert(next.ids.end(), begin, begin + x.len);
      next.ids.push_back(id);
      const auto abegin = x.attention.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(x.len));
      next.attention.insert(next.attention.end(), abegin, abegin + x.len);
      next.attention.push_back(1);
      const auto pbegin = x.position_ids.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(x.len));
      next.position_ids.insert(next.position_ids.end(), pbegin, pbegin + x.len);
      next.position_ids.push_back(x.position_ids[last] + 1);
    }
    if (all_done) break;
    x = std::move(next);
  }
  return out;
}

}  // namespace dlm::train
