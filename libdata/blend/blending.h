// helpers.cpp's blending indices, filled into arrays the caller owns (memory or cache files).
#pragma once

#include <cstdint>
#include <span>

namespace dlm::data::detail {

// build_blending_indices over dataset.size() samples.
void fill_blending_indices(std::span<const double> weights, std::span<std::int16_t> dataset,
                           std::span<std::int64_t> sample);
// build_exhaustive_blending_indices; the spans hold the sum of sizes.
void fill_exhaustive_blending_indices(std::span<const std::int64_t> sizes, std::span<std::int16_t> dataset,
                                      std::span<std::int64_t> sample);

}  // namespace dlm::data::detail
