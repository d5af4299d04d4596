// The per-row arithmetic both samplers share: float64 softmax, nucleus/top-k filters, Gumbel-max.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dlm/train/philox.h"
#include "dlm/train/sampler.h"

namespace dlm::train::detail {

// Domains of the sampler's random stream.
inline constexpr std::uint32_t kGumbel = 11;
inline constexpr std::uint32_t kRandomConfidence = 12;

// Throws dlm::Error when a logit the model returned is NaN (-inf is a logit a model may mean): NaN weights
// would otherwise sample as the mask token (or id 0) and print as if generation worked.
void require_no_nan(std::span<const float> logits);
// softmax(logits) in float64.
std::vector<double> softmax64(std::span<const float> logits);
// Nucleus filter as MegaDLMs' top_p_logits: sort by probability (descending, lower id first on ties),
// drop every token whose preceding cumulative probability exceeds p. Dropped entries become -inf.
void top_p_filter(std::vector<double>& logits, double p);
// Keeps the k largest (lower id first on ties); others become -inf.
void top_k_filter(std::vector<double>& logits, std::int64_t k);
// argmax_v (logits_v - T log(-log U_v)); U_v addressed by (domain, draw, v). T = 0: plain argmax.
std::int32_t gumbel_argmax(std::span<const double> logits, double temperature, const CounterRng& rng,
                           std::uint32_t domain, std::uint64_t draw);

// Left-padded batch of the prompts followed by `extra` copies of `fill`.
SequenceBatch left_padded(std::span<const std::vector<std::int32_t>> prompts, std::int64_t extra,
                          std::int32_t fill, std::int32_t pad);

}  // namespace dlm::train::detail
