#include "dlm/data/numpy_generator.h"

#include <array>

#include "dlm/common/error.h"

namespace dlm::data {
namespace {

constexpr std::uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr std::uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr std::size_t kPoolSize = 4;

std::uint32_t hashmix(std::uint32_t value, std::uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

std::uint32_t mix(std::uint32_t x, std::uint32_t y) {
  std::uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// SeedSequence(seed).generate_state(4, numpy.uint64).
std::array<std::uint64_t, 4> seed_sequence_state(std::uint64_t seed) {
  std::vector<std::uint32_t> entropy;
  do {
    entropy.push_back(static_cast<std::uint32_t>(seed));
    seed >>= 32;
  } while (seed > 0);
  std::array<std::uint32_t, kPoolSize> pool{};
  std::uint32_t hash_const = kInitA;
  for (std::size_t i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0, hash_const);
  for (std::size_t src = 0; src < kPoolSize; ++src)
    for (std::size_t dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  for (std::size_t src = kPoolSize; src < entropy.size(); ++src)
    for (std::size_t dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));
  std::array<std::uint32_t, 8> words{};
  std::uint32_t hash_b = kInitB;
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::uint32_t v = pool[i % kPoolSize];
    v ^= hash_b;
    hash_b *= kMultB;
    v *= hash_b;
    v ^= v >> kXShift;
    words[i] = v;
  }
  std::array<std::uint64_t, 4> out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = words[2 * i] | (std::uint64_t{words[2 * i + 1]} << 32);
  return out;
}

using Uint128 = NumpyPcg64::Uint128;
constexpr Uint128 kMultiplier = (static_cast<Uint128>(0x2360ed051fc65da4ull) << 64) | 0x4385df649fccf645ull;

}  // namespace

NumpyPcg64::NumpyPcg64(std::uint64_t seed) {
  const auto s = seed_sequence_state(seed);
  const Uint128 initstate = (static_cast<Uint128>(s[0]) << 64) | s[1];
  const Uint128 initseq = (static_cast<Uint128>(s[2]) << 64) | s[3];
  inc_ = (initseq << 1) | 1;
  state_ = 0;
  state_ = state_ * kMultiplier + inc_;
  state_ += initstate;
  state_ = state_ * kMultiplier + inc_;
}

std::uint64_t NumpyPcg64::next_uint64() {
  state_ = state_ * kMultiplier + inc_;
  const auto hi = static_cast<std::uint64_t>(state_ >> 64), lo = static_cast<std::uint64_t>(state_);
  const std::uint64_t x = hi ^ lo;
  const unsigned rot = static_cast<unsigned>(hi >> 58);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

std::uint32_t NumpyPcg64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const std::uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<std::uint32_t>(next >> 32);
  return static_cast<std::uint32_t>(next);
}

std::vector<std::int32_t> NumpyPcg64::integers_int32(std::int32_t low, std::int32_t high, std::size_t n) {
  if (high <= low) fail("NumpyPcg64::integers_int32: high must be above low");
  const auto range = static_cast<std::uint32_t>(static_cast<std::int64_t>(high) - 1 - low);  // closed [0, range]
  std::vector<std::int32_t> out(n);
  for (auto& v : out) {
    std::uint32_t draw = 0;
    if (range == 0xFFFFFFFFu) {
      draw = next_uint32();
    } else if (range != 0) {
      const std::uint32_t excl = range + 1;
      std::uint64_t m = std::uint64_t{next_uint32()} * excl;
      auto leftover = static_cast<std::uint32_t>(m);
      if (leftover < excl) {
        const std::uint32_t threshold = (0xFFFFFFFFu - range) % excl;
        while (leftover < threshold) {
          m = std::uint64_t{next_uint32()} * excl;
          leftover = static_cast<std::uint32_t>(m);
        }
      }
      draw = static_cast<std::uint32_t>(m >> 32);
    }
    v = static_cast<std::int32_t>(static_cast<std::int64_t>(low) + draw);
  }
  return out;
}

}  // namespace dlm::data
