// numpy's RandomState.shuffle, with the memory stalls and the branch misses hidden.
//
// Fisher-Yates swaps x[i] with x[j] for a random j <= i: on an array larger than the caches nearly
// every x[j] is a miss, and numpy waits for each in turn. The j's depend only on the generator,
// never on the array, so a block of them is drawn first and x[j] prefetched a few swaps ahead;
// the swaps themselves run in numpy's order, so the result is numpy's exactly.
// Drawing the j's is numpy's masked rejection (NumpyRandomState::interval) without its
// unpredictable branch: every 32-bit output is kept or dropped by arithmetic alone. Large arrays
// draw on a second thread while this one swaps.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "dlm/data/numpy_random.h"

namespace dlm::data::detail {

// js[k] = rng.interval(top - k) for k in [0, count), 1 <= top - count + 1, top < 2^32.
inline void draw_intervals(NumpyRandomState& rng, std::uint32_t top, std::size_t count, std::uint32_t* js) {
  std::uint32_t cur = top, mask = top;
  mask |= mask >> 1; mask |= mask >> 2; mask |= mask >> 4; mask |= mask >> 8; mask |= mask >> 16;
  for (std::size_t n = 0; n < count;) {
    const std::uint32_t v = rng.next_uint32() & mask;
    const std::uint32_t accepted = v <= cur;
    js[n] = v;  // overwritten by the next draw unless accepted
    n += accepted;
    cur -= accepted;
    // The mask is the smallest 2^k - 1 >= cur; cur falls by one, so it loses at most one bit.
    mask >>= static_cast<std::uint32_t>(cur <= (mask >> 1));
  }
}

// Swaps positions top, top-1, ..., top-count+1 with their drawn partners, in numpy's order, each
// partner prefetched kAhead swaps early.
template <typename T>
void swap_block(std::span<T> x, std::size_t top, std::size_t count, const std::uint32_t* js) {
  constexpr std::size_t kAhead = 32;
  for (std::size_t k = 0; k < count && k < kAhead; ++k) __builtin_prefetch(&x[js[k]], 1);
  T* at = x.data() + top;
  for (std::size_t k = 0; k < count; ++k) {
    if (k + kAhead < count) __builtin_prefetch(&x[js[k + kAhead]], 1);
    std::swap(*(at - k), x[js[k]]);
  }
}

// A large shuffle is a pipeline: one thread draws blocks of partners into a ring while this one
// swaps, so the generator's time hides behind the memory stalls (the swaps stay in numpy's order).
template <typename T>
void shuffle_pipelined(std::span<T> x, NumpyRandomState& rng) {
  constexpr std::size_t kBlock = 1 << 14, kSlots = 32;
  std::vector<std::uint32_t> ring(kBlock * kSlots);
  std::atomic<std::size_t> drawn{0}, swapped{0};
  auto count_at = [&](std::size_t i) { return std::min(i - 1, kBlock); };
  std::thread producer([&] {
    for (std::size_t i = x.size(), b = 0; i > 1; i -= count_at(i), ++b) {
      for (std::size_t s = swapped.load(std::memory_order_acquire); b - s >= kSlots; s = swapped.load(std::memory_order_acquire))
        swapped.wait(s, std::memory_order_acquire);
      draw_intervals(rng, static_cast<std::uint32_t>(i - 1), count_at(i), ring.data() + (b % kSlots) * kBlock);
      drawn.store(b + 1, std::memory_order_release);
      drawn.notify_one();
    }
  });
  for (std::size_t i = x.size(), b = 0; i > 1; i -= count_at(i), ++b) {
    for (std::size_t d = drawn.load(std::memory_order_acquire); d <= b; d = drawn.load(std::memory_order_acquire))
      drawn.wait(d, std::memory_order_acquire);
    swap_block(x, i - 1, count_at(i), ring.data() + (b % kSlots) * kBlock);
    swapped.store(b + 1, std::memory_order_release);
    swapped.notify_one();
  }
  producer.join();
}

template <typename T>
void shuffle_like_numpy(std::span<T> x, NumpyRandomState& rng) {
  if (x.size() < 2) return;
  if (x.size() - 1 > 0xffffffffu) {  // 64-bit draws for the top positions: numpy's plain loop there
    std::size_t i = x.size();
    for (; i - 1 > 0xffffffffu; --i) std::swap(x[i - 1], x[static_cast<std::size_t>(rng.interval(i - 1))]);
    shuffle_like_numpy(x.first(i), rng);
    return;
  }
  if (x.size() >= (std::size_t{1} << 22)) return shuffle_pipelined(x, rng);
  constexpr std::size_t kBlock = 4096;
  std::uint32_t js[kBlock];
  for (std::size_t i = x.size(); i > 1;) {
    const std::size_t count = std::min(i - 1, kBlock);
    draw_intervals(rng, static_cast<std::uint32_t>(i - 1), count, js);
    swap_block(x, i - 1, count, js);
    i -= count;
  }
}

}  // namespace dlm::data::detail
