// NumpyRandomState: numpy's legacy `numpy.random.RandomState`, bit for bit.
//
// Megatron shuffles its document and sample indices with `numpy.random.RandomState(seed).shuffle`, and
// MegaDLMs draws variable lengths with `uniform` / `randint` of the same generator; reproducing those
// streams exactly is what lets a run move between Megatron and dlm with the same samples.
//
//   seeding   an integer seed s in [0, 2^32-1] runs MT19937's init_genrand(s); a sequence of 32-bit
//             words runs init_by_array (numpy's `_legacy_seeding`).
//   double    (a >> 5) * 2^26 + (b >> 6), over 2^53, from two consecutive 32-bit outputs a, b.
//   uniform   low + (high - low) * double.
//   integers  in [0, r] by masked rejection: mask = smallest 2^k - 1 >= r; draw and AND until <= r.
//             r <= 2^32-1 draws one 32-bit output; larger r draws 64 bits, two outputs, high first.
//   shuffle   for i = n-1 down to 1: swap x[i], x[interval(i)] (Fisher-Yates from the end).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace dlm::data {

class NumpyRandomState {
 public:
  // numpy.random.RandomState(seed) with an integer seed (init_genrand).
  explicit NumpyRandomState(std::uint32_t seed = 0) { seed_int(seed); }
  // numpy.random.RandomState([k0, k1, ...]) (init_by_array). Each key must fit 32 bits.
  explicit NumpyRandomState(std::span<const std::uint32_t> key) { seed_array(key); }

  void seed_int(std::uint32_t seed);
  void seed_array(std::span<const std::uint32_t> key);

  // The raw MT19937 stream.
  std::uint32_t next_uint32() {
    if (pos_ >= kN) twist();
    std::uint32_t y = state_[pos_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }
  std::uint64_t next_uint64() {
    const std::uint64_t high = next_uint32();
    return (high << 32) | next_uint32();
  }

  // random_sample() / random(): a double in [0, 1) with 53 random bits.
  double random_sample() {
    const std::uint32_t a = next_uint32() >> 5, b = next_uint32() >> 6;
    return (a * 67108864.0 + b) / 9007199254740992.0;
  }
  // uniform(low, high): low + (high - low) * random_sample().
  double uniform(double low, double high) { return low + (high - low) * random_sample(); }

  // A uniform integer in [0, max] by numpy's masked rejection (random_interval; also what
  // randint's masked bounded draws do for the same range).
  std::uint64_t interval(std::uint64_t max) {
    if (max == 0) return 0;
    std::uint64_t mask = max;
    mask |= mask >> 1; mask |= mask >> 2; mask |= mask >> 4;
    mask |= mask >> 8; mask |= mask >> 16; mask |= mask >> 32;
    std::uint64_t value;
    if (max <= 0xffffffffu) {
      while ((value = (next_uint32() & mask)) > max) {}
    } else {
      while ((value = (next_uint64() & mask)) > max) {}
    }
    return value;
  }

  // randint(low, high) with numpy's default int64 dtype: a uniform integer in [low, high).
  // Throws dlm::Error when low >= high (numpy's "low >= high" ValueError).
  std::int64_t randint(std::int64_t low, std::int64_t high);
  // randint(low, high, size=n).
  std::vector<std::int64_t> randint(std::int64_t low, std::int64_t high, std::size_t n);

  // shuffle(x) of a 1-D array, in place.
  template <typename T>
  void shuffle(std::span<T> x) {
    for (std::size_t i = x.size(); i > 1; --i) {
      const std::size_t j = static_cast<std::size_t>(interval(i - 1));
      std::swap(x[i - 1], x[j]);
    }
  }
  template <typename T>
  void shuffle(std::vector<T>& x) { shuffle(std::span<T>(x)); }

  // permutation(n): arange(n) shuffled (numpy gives int64).
  std::vector<std::int64_t> permutation(std::size_t n);

 private:
  static constexpr std::size_t kN = 624;
  void twist();
  std::array<std::uint32_t, kN> state_{};
  std::size_t pos_ = kN;
};

}  // namespace dlm::data
