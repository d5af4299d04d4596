#include "dlm/train/philox.h"

namespace dlm::train {

PhiloxCounter philox4x32(PhiloxCounter c, PhiloxKey k) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint64_t p0 = std::uint64_t{kM0} * c[0];
    std::uint64_t p1 = std::uint64_t{kM1} * c[2];
    c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

}  // namespace dlm::train
