// Central finite differences for the backend's ops and the model: every op is checked as a scalar
// loss sum(out * R) (R random) whose analytic gradient is the op's backward with dout = R.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dlm/train/model.h"

namespace dlm::train::testing {

inline std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// (lp - lm) / 2h per element of `x`, with `loss` reading x each call. fp32 forward passes with h = 1e-2
// keep both rounding (~1e-6 / h) and truncation (~h^2) errors far below the tolerances used.
inline std::vector<double> numeric_gradient(std::vector<float>& x, const std::function<double()>& loss,
                                            float h = 1e-2f) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    g[i] = (lp - lm) / (2.0 * double(h));
  }
  return g;
}

// ||a - n|| / ||n||: the relative error of a whole gradient (0 when both are 0).
inline double relative_error(const std::vector<float>& analytic, const std::vector<double>& numeric) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    diff += (analytic[i] - numeric[i]) * (analytic[i] - numeric[i]);
    norm += numeric[i] * numeric[i];
  }
  if (norm == 0) return std::sqrt(diff);
  return std::sqrt(diff / norm);
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// Every parameter of `m`: the gradient its last backward left against central differences (step h) of `loss`,
// which runs the forward at the current weights; relative error under `tolerance`. With `every_one_moves`, a
// parameter whose gradient is all zeros fails too (a MoE model's unchosen experts legitimately have none).
inline void expect_parameter_gradients_match(Model& m, const std::function<double()>& loss, float h, double tolerance,
                                             bool every_one_moves) {
  for (const auto& p : m.parameters()) {
    const std::string& name = p.spec.name;
    const auto analytic = m.export_gradient(name);
    auto values = m.export_parameter(name);
    const auto numeric = numeric_gradient(values, [&] {
      m.import_parameter(name, values);
      return loss();
    }, h);
    m.import_parameter(name, values);
    EXPECT_LT(relative_error(analytic, numeric), tolerance) << name;
    if (every_one_moves) EXPECT_GT(dot(analytic, analytic), 0.0) << name << " has no gradient at all";
  }
}

}  // namespace dlm::train::testing
