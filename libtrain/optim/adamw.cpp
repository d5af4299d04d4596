#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/optimizer.h"

namespace dlm::train {

void AdamW::step(std::span<const ParamRef> params, double lr) {
  if (m_.empty()) {
    for (const auto& p : params) {
      m_.emplace_back(p.value.size(), 0.0f);
      v_.emplace_back(p.value.size(), 0.0f);
    }
  }
  if (m_.size() != params.size()) fail(fmt::format("AdamW: {} tensors, state for {}", params.size(), m_.size()));
  ++steps_;
  const auto& o = options_;
  const double bias1 = 1.0 - std::pow(o.beta1, static_cast<double>(steps_));
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(steps_)));
  // torch computes these scalars in double and applies them to fp32 tensors.
  const auto step_size = static_cast<float>(lr / bias1);
  const auto b1 = static_cast<float>(1.0 - o.beta1), beta2 = static_cast<float>(o.beta2),
             b2 = static_cast<float>(1.0 - o.beta2), eps = static_cast<float>(o.eps),
             bc2 = static_cast<float>(bias2_sqrt);
  for (std::size_t t = 0; t < params.size(); ++t) {
    const auto& p = params[t];
    if (p.grad.size() != p.value.size() || m_[t].size() != p.value.size())
      fail(fmt::format("AdamW: tensor {} changed size", p.name));
    const auto decay = static_cast<float>(1.0 - lr * (p.decay ? o.weight_decay : 0.0));
    float* x = p.value.data();
    const float* g = p.grad.data();
    float* m = m_[t].data();
    float* v = v_[t].data();
    for (std::size_t i = 0; i < p.value.size(); ++i) {
      x[i] *= decay;
      m[i] += b1 * (g[i] - m[i]);
      v[i] = v[i] * beta2 + b2 * g[i] * g[i];
      x[i] -= step_size * (m[i] / (std::sqrt(v[i]) / bc2 + eps));
    }
  }
}

double global_grad_norm(std::span<const std::span<const float>> grads) {
  double sum = 0;
  for (auto g : grads)
    for (float x : g) sum += static_cast<double>(x) * x;
  return std::sqrt(sum);
}

double clip_coefficient(double max_norm, double norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm) {
  std::vector<std::span<const float>> view(grads.begin(), grads.end());
  const double norm = global_grad_norm(view);
  const double coeff = clip_coefficient(max_norm, norm);
  if (coeff < 1.0)
    for (auto g : grads)
      for (float& x : g) x = static_cast<float>(x * coeff);
  return norm;
}

}  // namespace dlm::train
