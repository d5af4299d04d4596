// The mixture-of-experts router on the host (math in moe_router.h). Backward, per token n:
//   dw_j from the experts; with normalisation w_j = v_j / S, S = sum_j v_j (+ eps): dv_j = (dw_j - sum_i dw_i w_i) / S
//   ds[e] = dv_j for e = e_j, plus the aux loss's  coeff * E / (k N^2) * c_e  through a
//   softmax:  dl = s * (ds - sum_e ds s) + loss_weight * coeff_z * 2 lse / N * s
//   sigmoid:  a = s / Z: ds += (g - sum_e g a) / Z for the aux gradient g; dl = ds * s (1 - s) + the z term.
#include "dlm/train/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train {
namespace {

constexpr double kEps = 1e-20;  // Megatron's, in the sigmoid router's normalisations

// The drop: per expert, its slots ranked by the policy, the first C = expert_capacity(N k, ...) kept.
void drop_over_capacity(const RouterOptions& o, Routing& r) {
  const std::int64_t E = o.experts, slots = static_cast<std::int64_t>(r.experts.size());
  r.capacity = expert_capacity(slots, o.experts, o.capacity_factor);
  r.kept.assign(static_cast<std::size_t>(slots), 1);
  std::vector<std::vector<std::int64_t>> by_expert(static_cast<std::size_t>(E));
  for (std::int64_t i = 0; i < slots; ++i) by_expert[static_cast<std::size_t>(r.experts[i])].push_back(i);
  for (std::int64_t e = 0; e < E; ++e) {
    auto& s = by_expert[static_cast<std::size_t>(e)];
    if (static_cast<std::int64_t>(s.size()) <= r.capacity) continue;
    if (o.drop_policy == ckpt::MoeDropPolicy::kProbs)
      std::stable_sort(s.begin(), s.end(), [&](std::int64_t a, std::int64_t b) { return r.weights[a] > r.weights[b]; });
    for (std::size_t j = static_cast<std::size_t>(r.capacity); j < s.size(); ++j) {
      r.kept[static_cast<std::size_t>(s[j])] = 0;
      r.weights[static_cast<std::size_t>(s[j])] = 0.0f;
      --r.tokens_per_expert[static_cast<std::size_t>(e)];
    }
  }
}

}  // namespace

std::int64_t expert_capacity(std::int64_t slots, int experts, double capacity_factor) {
  if (capacity_factor <= 0) return 0;
  return static_cast<std::int64_t>(
      std::ceil(static_cast<double>(slots) / static_cast<double>(experts) * capacity_factor));
}

RouterOptions RouterOptions::of(const ckpt::ModelConfig& c) {
  return {c.num_experts,        c.moe_router_topk,  c.moe_router_score_function,  c.moe_norm_topk_prob,
          c.moe_aux_loss_coeff, c.moe_z_loss_coeff, c.moe_expert_capacity_factor, c.moe_token_drop_policy};
}

Routing route(const RouterOptions& o, std::span<const float> logits) {
  const std::int64_t E = o.experts, k = o.topk, N = static_cast<std::int64_t>(logits.size()) / E;
  if (E <= 0 || k <= 0 || k > E || N * E != static_cast<std::int64_t>(logits.size()))
    fail(fmt::format("moe router: {} logits for {} experts, top-{}", logits.size(), E, k));
  const bool sigmoid = o.score == ckpt::MoeScoreFunction::kSigmoid;
  Routing r;
  r.tokens = N;
  r.logits.assign(logits.begin(), logits.end());
  r.scores.resize(static_cast<std::size_t>(N * E));
  r.experts.resize(static_cast<std::size_t>(N * k));
  r.weights.resize(static_cast<std::size_t>(N * k));
  r.lse.resize(static_cast<std::size_t>(N));
  r.tokens_per_expert.assign(static_cast<std::size_t>(E), 0);
  r.aux_probability_sum.assign(static_cast<std::size_t>(E), 0.0);
  std::vector<std::int32_t> order(static_cast<std::size_t>(E));
  double z = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    const float* l = logits.data() + n * E;
    float* s = r.scores.data() + n * E;
    float mx = l[0];
    for (std::int64_t e = 0; e < E; ++e) {
      if (!std::isfinite(l[e])) fail(fmt::format("moe router: logit {} of token {} is not finite", l[e], n));
      mx = std::max(mx, l[e]);
    }
    double sum = 0;
    for (std::int64_t e = 0; e < E; ++e) sum += std::exp(double(l[e]) - mx);
    const double lse = mx + std::log(sum);
    r.lse[n] = static_cast<float>(lse);
    z += lse * lse;
    for (std::int64_t e = 0; e < E; ++e)
      s[e] = sigmoid ? static_cast<float>(1 / (1 + std::exp(-double(l[e])))) : static_cast<float>(std::exp(l[e] - lse));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](std::int32_t a, std::int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
    double picked = 0;
    for (std::int64_t j = 0; j < k; ++j) picked += s[order[j]];
    const double denom = o.norm_topk_prob ? picked + (sigmoid ? kEps : 0.0) : 1.0;
    for (std::int64_t j = 0; j < k; ++j) {
      r.experts[n * k + j] = order[j];
      r.weights[n * k + j] = static_cast<float>(s[order[j]] / denom);
      ++r.tokens_per_expert[order[j]];
    }
    double total = 0;
    if (sigmoid)
      for (std::int64_t e = 0; e < E; ++e) total += s[e];
    for (std::int64_t e = 0; e < E; ++e) r.aux_probability_sum[e] += sigmoid ? s[e] / (total + kEps) : s[e];
  }
  if (o.capacity_factor > 0) drop_over_capacity(o, r);
  double dot = 0;
  for (std::int64_t e = 0; e < E; ++e) dot += r.aux_probability_sum[e] * double(r.tokens_per_expert[e]);
  r.aux_loss = o.aux_loss_coeff * double(E) / (double(k) * double(N) * double(N)) * dot;
  r.z_loss = o.z_loss_coeff * z / double(N);
  return r;
}

void route_backward(const RouterOptions& o, const Routing& r, std::span<const float> dweights, double loss_weight,
                    std::span<float> dlogits) {
  const std::int64_t E = o.experts, k = o.topk, N = r.tokens;
  if (static_cast<std::int64_t>(dweights.size()) != N * k || static_cast<std::int64_t>(dlogits.size()) != N * E)
    fail(fmt::format("moe router backward: {} weight gradients and {} logit gradients for {} tokens", dweights.size(),
                     dlogits.size(), N));
  const bool sigmoid = o.score == ckpt::MoeScoreFunction::kSigmoid;
  const double aux_scale = loss_weight * o.aux_loss_coeff * double(E) / (double(k) * double(N) * double(N));
  const double z_scale = loss_weight * o.z_loss_coeff * 2.0 / double(N);
  std::vector<double> ds(static_cast<std::size_t>(E)), g(static_cast<std::size_t>(E));
  for (std::int64_t n = 0; n < N; ++n) {
    const float* s = r.scores.data() + n * E;
    const float* w = r.weights.data() + n * k;
    const float* dw = dweights.data() + n * k;
    const std::int32_t* ex = r.experts.data() + n * k;
    std::fill(ds.begin(), ds.end(), 0.0);
    // A dropped slot's weight is w * 0: no gradient reaches its w; the normalisation saw the weights before the drop.
    const auto kept = [&](std::int64_t j) { return r.kept.empty() || r.kept[static_cast<std::size_t>(n * k + j)] != 0; };
    double picked = 0, dot = 0;
    for (std::int64_t j = 0; j < k; ++j) picked += s[ex[j]];
    const double denom = o.norm_topk_prob ? picked + (sigmoid ? kEps : 0.0) : 1.0;
    for (std::int64_t j = 0; j < k; ++j)
      if (kept(j)) dot += double(dw[j]) * (r.kept.empty() ? w[j] : s[ex[j]] / denom);
    for (std::int64_t j = 0; j < k; ++j) {
      const double g = kept(j) ? double(dw[j]) : 0.0;
      ds[ex[j]] += o.norm_topk_prob ? (g - dot) / denom : g;
    }
    for (std::int64_t e = 0; e < E; ++e) g[e] = aux_scale * double(r.tokens_per_expert[e]);
    float* dl = dlogits.data() + n * E;
    if (sigmoid) {
      double total = 0, ga = 0;
      for (std::int64_t e = 0; e < E; ++e) total += s[e];
      for (std::int64_t e = 0; e < E; ++e) ga += g[e] * s[e] / (total + kEps);
      for (std::int64_t e = 0; e < E; ++e) ds[e] += (g[e] - ga) / (total + kEps);
      for (std::int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(ds[e] * s[e] * (1.0 - s[e]));
    } else {
      for (std::int64_t e = 0; e < E; ++e) ds[e] += g[e];
      double sds = 0;
      for (std::int64_t e = 0; e < E; ++e) sds += ds[e] * s[e];
      for (std::int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(s[e] * (ds[e] - sds));
    }
    // z = coeff_z / N * sum lse^2: d/dl = 2 coeff_z lse / N * softmax(l), softmax from lse.
    if (z_scale != 0) {
      const float* l = r.logits.data() + n * E;
      for (std::int64_t e = 0; e < E; ++e) dl[e] += static_cast<float>(z_scale * r.lse[n] * std::exp(double(l[e]) - r.lse[n]));
    }
  }
}

}  // namespace dlm::train
