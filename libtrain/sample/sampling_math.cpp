#include "sampling_math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train::detail {

void require_no_nan(std::span<const float> logits) {
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (std::isnan(logits[i]))
      fail(fmt::format("sampler: logit {} of the model is NaN (NaN weights? dlm-ckpt validate lists them)", i));
}

std::vector<double> softmax64(std::span<const float> logits) {
  std::vector<double> p(logits.begin(), logits.end());
  double mx = -std::numeric_limits<double>::infinity();
  for (double x : p) mx = std::max(mx, x);
  double sum = 0;
  for (double& x : p) sum += (x = std::exp(x - mx));
  for (double& x : p) x /= sum;
  return p;
}

namespace {
// Indices by value, descending; the lower index first on ties (a stable order).
std::vector<std::int32_t> order_desc(const std::vector<double>& v) {
  std::vector<std::int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::int32_t a, std::int32_t b) { return v[a] > v[b]; });
  return idx;
}
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
}  // namespace

void top_p_filter(std::vector<double>& logits, double p) {
  if (p >= 1.0) return;
  std::vector<double> probs(logits.size());
  {
    double mx = kNegInf, sum = 0;
    for (double x : logits) mx = std::max(mx, x);
    for (std::size_t i = 0; i < logits.size(); ++i) sum += (probs[i] = std::exp(logits[i] - mx));
    for (double& x : probs) x /= sum;
  }
  auto idx = order_desc(probs);
  double before = 0;
  for (auto i : idx) {
    if (before > p) logits[i] = kNegInf;
    before += probs[i];
  }
}

void top_k_filter(std::vector<double>& logits, std::int64_t k) {
  if (k <= 0 || k >= static_cast<std::int64_t>(logits.size())) return;
  auto idx = order_desc(logits);
  for (std::size_t r = static_cast<std::size_t>(k); r < idx.size(); ++r) logits[idx[r]] = kNegInf;
}

std::int32_t gumbel_argmax(std::span<const double> logits, double temperature, const CounterRng& rng,
                           std::uint32_t domain, std::uint64_t draw) {
  std::int32_t best = 0;  // an all -inf row yields id 0
  double best_value = kNegInf;
  for (std::size_t v = 0; v < logits.size(); ++v) {
    double x = logits[v];
    if (temperature > 0 && x != kNegInf)
      x -= temperature * std::log(-std::log(rng.uniform_open0(domain, draw, static_cast<std::uint32_t>(v))));
    if (x > best_value) {
      best_value = x;
      best = static_cast<std::int32_t>(v);
    }
  }
  return best;
}

SequenceBatch left_padded(std::span<const std::vector<std::int32_t>> prompts, std::int64_t extra,
                          std::int32_t fill, std::int32_t pad) {
  SequenceBatch b;
  b.rows = static_cast<std::int64_t>(prompts.size());
  std::int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(p.size()));
  b.len = longest + extra;
  b.ids.assign(static_cast<std::size_t>(b.rows * b.len), fill);
  b.attention.assign(b.ids.size(), 1);
  b.position_ids.assign(b.ids.size(), 0);
  for (std::int64_t r = 0; r < b.rows; ++r) {
    const auto& p = prompts[static_cast<std::size_t>(r)];
    const std::int64_t padding = longest - static_cast<std::int64_t>(p.size());
    auto* ids = b.ids.data() + r * b.len;
    auto* att = b.attention.data() + r * b.len;
    for (std::int64_t j = 0; j < padding; ++j) ids[j] = pad, att[j] = 0;
    std::copy(p.begin(), p.end(), ids + padding);
    std::int32_t pos = 0;
    for (std::int64_t j = 0; j < b.len; ++j)
      if (att[j]) b.position_ids[static_cast<std::size_t>(r * b.len + j)] = pos++;
  }
  return b;
}

}  // namespace dlm::train::detail
