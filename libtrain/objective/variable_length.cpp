// MegaDLMs' variable-length draw: numpy's legacy RandomState(seed), u = uniform(0, 1), then
// r = randint(2, length + 1). Only the two draws are needed, so the legacy MT19937 stream is
// reproduced here for them: init_genrand seeding (numpy's path for an integer seed), random_sample
// from two 32-bit words ((a >> 5) 2^26 + (b >> 6)) / 2^53, and randint's masked rejection on 32-bit
// words. TODO: use libdata's NumpyRandomState (include/dlm/data/numpy_random.h), the same generator, instead.
#include <array>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/objective.h"

namespace dlm::train {
namespace {

class LegacyMt19937 {
 public:
  explicit LegacyMt19937(std::uint32_t seed) {
    state_[0] = seed;
    for (std::uint32_t i = 1; i < kN; ++i)
      state_[i] = 1812433253u * (state_[i - 1] ^ (state_[i - 1] >> 30)) + i;
    pos_ = kN;
  }
  std::uint32_t next() {
    if (pos_ == kN) twist();
    std::uint32_t y = state_[pos_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
  }
  double next_double() {
    const std::uint32_t a = next() >> 5, b = next() >> 6;
    return (a * 67108864.0 + b) / 9007199254740992.0;
  }
  // numpy's legacy randint(low, high) for high - low - 1 < 2^32: the smallest all-ones mask over the
  // range, words drawn until one falls inside.
  std::int64_t randint(std::int64_t low, std::int64_t high) {
    const auto range = static_cast<std::uint32_t>(high - 1 - low);
    if (range == 0) return low;
    std::uint32_t mask = range;
    for (int shift = 1; shift < 32; shift <<= 1) mask |= mask >> shift;
    std::uint32_t v;
    while ((v = next() & mask) > range) {
    }
    return low + v;
  }

 private:
  static constexpr std::uint32_t kN = 624, kM = 397;
  void twist() {
    for (std::uint32_t i = 0; i < kN; ++i) {
      const std::uint32_t y = (state_[i] & 0x80000000u) | (state_[(i + 1) % kN] & 0x7fffffffu);
      state_[i] = state_[(i + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    pos_ = 0;
  }
  std::array<std::uint32_t, kN> state_{};
  std::uint32_t pos_ = 0;
};

}  // namespace

std::int64_t variable_length(double prob, std::uint64_t seed, std::int64_t length) {
  if (prob <= 0 || length <= 2) return length;
  if (seed > 0xffffffffull) fail(fmt::format("variable length: seed {} is beyond numpy's 32-bit seeds", seed));
  LegacyMt19937 rng(static_cast<std::uint32_t>(seed));
  const double u = rng.next_double();
  const std::int64_t r = rng.randint(2, length + 1);
  return u < prob ? r : length;
}

}  // namespace dlm::train
