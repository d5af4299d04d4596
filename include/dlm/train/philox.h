// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a counter-based
// generator. A draw is a pure function of (key, counter), so a value is addressed rather than consumed:
// the noise of global sample s at position j is the same whatever the batch layout, the number of
// ranks, or whether the run was resumed halfway.
#pragma once

#include <array>
#include <cstdint>

namespace dlm::train {

using PhiloxCounter = std::array<std::uint32_t, 4>;
using PhiloxKey = std::array<std::uint32_t, 2>;

// Ten rounds of Philox4x32 on one counter block (Random123's philox4x32_10).
PhiloxCounter philox4x32(PhiloxCounter counter, PhiloxKey key);

// Independent streams of one seed: `domain` names what the numbers are for (mask levels, mask draws,
// Gumbel noise...), `index` the thing drawn for (a global sample, a sampling step) and `sub` the
// position inside it.
class CounterRng {
 public:
  explicit CounterRng(std::uint64_t seed) : key_{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)} {}

  std::array<std::uint32_t, 4> bits(std::uint32_t domain, std::uint64_t index, std::uint32_t sub) const {
    return philox4x32({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), sub, domain}, key_);
  }
  // Uniform in [0, 1) with 53 random bits (numpy's construction from two 32-bit words).
  double uniform(std::uint32_t domain, std::uint64_t index, std::uint32_t sub) const {
    auto b = bits(domain, index, sub);
    return ((b[0] >> 5) * 67108864.0 + (b[1] >> 6)) / 9007199254740992.0;
  }
  // Uniform in (0, 1]: safe under log().
  double uniform_open0(std::uint32_t domain, std::uint64_t index, std::uint32_t sub) const {
    return 1.0 - uniform(domain, index, sub);
  }

 private:
  PhiloxKey key_;
};

}  // namespace dlm::train
