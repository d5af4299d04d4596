// Cross-entropy over the real vocabulary: columns >= vocab (Megatron's padding) are sliced away, so
// they take no probability and get no gradient.
//   lse = log sum_{j<V} exp(l_j),  ce = lse - l_label;   dl_j = w (exp(l_j - lse) - [j == label]).
// A label < 0 is ignored: ce 0, gradient 0.
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "cpu_backend.h"
#include "dlm/common/error.h"

namespace dlm::train::cpu {

namespace {

void check_labels(const std::int32_t* labels, std::int64_t n, std::int64_t vocab) {
  for (std::int64_t i = 0; i < n; ++i)
    if (labels[i] >= vocab)
      fail(fmt::format("cpu backend: cross_entropy: label {} at position {} is outside the vocabulary of {}",
                       labels[i], i, vocab));
}

}  // namespace

void CpuBackend::cross_entropy_forward(const Tensor& logits, const Tensor& labels, std::int64_t vocab,
                                       const Tensor& ce, const Tensor& lse) {
  const std::int64_t width = logits.dim(logits.rank() - 1), n = logits.numel() / width;
  if (vocab <= 0 || vocab > width)
    fail(fmt::format("cpu backend: cross_entropy: vocabulary {} does not fit logits of width {}", vocab, width));
  expect_numel("cross_entropy_forward", "labels", labels, n);
  expect_numel("cross_entropy_forward", "ce", ce, n);
  expect_numel("cross_entropy_forward", "lse", lse, n);
  const std::int32_t* lab = i32(labels);
  check_labels(lab, n, vocab);
  const float* pl = f32(logits);
  float *pce = f32(ce), *plse = f32(lse);
  parallel_for(n, 4, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) {
      const float* row = pl + t * width;
      float m = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < vocab; ++j) m = std::max(m, row[j]);
      double sum = 0;
      for (std::int64_t j = 0; j < vocab; ++j) sum += std::exp(double(row[j]) - m);
      const double l = m + std::log(sum);
      plse[t] = static_cast<float>(l);
      pce[t] = lab[t] < 0 ? 0.0f : static_cast<float>(l - row[lab[t]]);
    }
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                        const Tensor& weights, std::int64_t vocab, const Tensor& dlogits) {
  expect_numel("cross_entropy_backward", "labels", labels, labels.numel());
  check_labels(i32(labels), labels.numel(), vocab);
  cross_entropy_backward_shard(logits, labels, 0, lse, weights, vocab, dlogits);
}

void CpuBackend::cross_entropy_backward_shard(const Tensor& logits, const Tensor& labels, std::int64_t first,
                                              const Tensor& lse, const Tensor& weights, std::int64_t vocab,
                                              const Tensor& dlogits) {
  const std::int64_t width = logits.dim(logits.rank() - 1), n = logits.numel() / width;
  if (vocab < 0 || vocab > width)
    fail(fmt::format("cpu backend: cross_entropy: {} real columns do not fit logits of width {}", vocab, width));
  expect_numel("cross_entropy_backward", "labels", labels, n);
  expect_numel("cross_entropy_backward", "lse", lse, n);
  expect_numel("cross_entropy_backward", "weights", weights, n);
  expect_numel("cross_entropy_backward", "dlogits", dlogits, n * width);
  const std::int32_t* lab = i32(labels);
  const float *pl = f32(logits), *plse = f32(lse), *pw = f32(weights);
  float* pd = f32(dlogits);
  parallel_for(n, 4, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) {
      float* d = pd + t * width;
      const float w = pw[t];
      if (lab[t] < 0 || w == 0.0f) {
        std::memset(d, 0, sizeof(float) * width);
        continue;
      }
      const float* row = pl + t * width;
      for (std::int64_t j = 0; j < vocab; ++j) d[j] = w * static_cast<float>(std::exp(double(row[j]) - plse[t]));
      for (std::int64_t j = vocab; j < width; ++j) d[j] = 0.0f;
      const std::int64_t local = lab[t] - first;
      if (local >= 0 && local < vocab) d[local] -= w;
    }
  });
}

}  // namespace dlm::train::cpu
