// numpy's RandomState.shuffle, with the memory stalls hidden.
//
// Fisher-Yates swaps x[i] with x[j] for a random j <= i: on an array larger than the caches nearly
// every x[j] is a miss, and numpy waits for each in turn. The j's depend only on the generator,
// never on the array, so a block of them is drawn first and x[j] prefetched a few swaps ahead;
// the swaps themselves run in numpy's order, so the result is numpy's exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "dlm/data/numpy_random.h"

namespace dlm::data::detail {

template <typename T>
void shuffle_like_numpy(std::span<T> x, NumpyRandomState& rng) {
  constexpr std::size_t kBlock = 512, kAhead = 24;
  std::size_t js[kBlock];
  std::size_t i = x.size();
  while (i > 1) {
    // This block swaps positions i-1 down to stop (>= 1).
    const std::size_t count = (i - 1) < kBlock ? (i - 1) : kBlock;
    for (std::size_t k = 0; k < count; ++k) js[k] = static_cast<std::size_t>(rng.interval(i - 1 - k));
    for (std::size_t k = 0; k < count && k < kAhead; ++k) __builtin_prefetch(&x[js[k]], 1);
    for (std::size_t k = 0; k < count; ++k) {
      if (k + kAhead < count) __builtin_prefetch(&x[js[k + kAhead]], 1);
      std::swap(x[i - 1 - k], x[js[k]]);
    }
    i -= count;
  }
}

}  // namespace dlm::data::detail
