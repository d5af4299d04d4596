// Philox4x32-10 on the device, the host's CounterRng (include/dlm/train/philox.h) draw for draw: counter
// {index lo, index hi, sub, domain}, key = seed; U is numpy's 53-bit double from two 32-bit words.
#pragma once

#include <cstdint>

namespace dlm::train::cuda {

__device__ __forceinline__ double philox_uniform(std::uint64_t seed, std::uint32_t domain, std::uint64_t index, std::uint32_t sub) {
  std::uint32_t c[4] = {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), sub, domain};
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const std::uint32_t hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
    const std::uint32_t hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
    const std::uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0, c[1] = lo1, c[2] = n2, c[3] = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ((c[0] >> 5) * 67108864.0 + (c[1] >> 6)) / 9007199254740992.0;
}

}  // namespace dlm::train::cuda
