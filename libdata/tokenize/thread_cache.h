// A thread's caches of one kind, one per encoder (an owner id), for its four most recently added
// encoders: a fifth owner takes the slot of the one added longest ago, emptied.
#pragma once

#include <cstdint>

namespace dlm::data::tok {

template <class Cache>
Cache& thread_cache(std::uint64_t owner) {
  struct Caches {
    std::uint64_t owner[4] = {0, 0, 0, 0};
    Cache cache[4];
    unsigned next = 0;
  };
  thread_local Caches caches;
  for (int i = 0; i < 4; ++i)
    if (caches.owner[i] == owner) return caches.cache[i];
  const unsigned slot = caches.next++ % 4;
  caches.owner[slot] = owner;
  caches.cache[slot] = Cache{};
  return caches.cache[slot];
}

}  // namespace dlm::data::tok
