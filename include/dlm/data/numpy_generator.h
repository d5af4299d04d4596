// NumpyPcg64: numpy's `numpy.random.default_rng(seed)` (SeedSequence -> PCG64), bit for bit, for the draws
// megatron-core makes with it (MockGPTLowLevelDataset's sequence lengths).
//
//   SeedSequence(seed)  the seed's 32-bit words (0 is one word, 0) hashed into a pool of 4 words (hashmix and mix,
//                       numpy's bit_generator.pyx); generate_state(4, uint64) reads the pool cyclically through a
//                       second hash, pairs of 32-bit words as little-endian 64-bit words
//   PCG64               128-bit LCG (multiplier 0x2360ed051fc65da44385df649fccf645), state s0:s1 and stream i0:i1
//                       from generate_state; inc = (i << 1) | 1, state = 0, step, += s, step; each output steps
//                       then returns rotr64(hi ^ lo, hi >> 58)
//   next_uint32         the low half of a 64-bit output, then its high half (numpy buffers the other half)
//   integers(low, high, dtype=int32)  low + Lemire's bounded draw over [0, high - 1 - low] (numpy's default,
//                       use_masked=False): m = u32 * range; while (m mod 2^32) < (2^32 - range) mod range redraw
#pragma once

#include <cstdint>
#include <vector>

namespace dlm::data {

class NumpyPcg64 {
 public:
  __extension__ typedef unsigned __int128 Uint128;  // GCC's and Clang's 128-bit integer (PCG64's state)

  explicit NumpyPcg64(std::uint64_t seed);

  std::uint64_t next_uint64();
  std::uint32_t next_uint32();
  // Generator.integers(low, high, size=n, dtype=numpy.int32): n values in [low, high).
  std::vector<std::int32_t> integers_int32(std::int32_t low, std::int32_t high, std::size_t n);

 private:
  Uint128 state_ = 0, inc_ = 0;
  bool has_uint32_ = false;
  std::uint32_t uinteger_ = 0;
};

}  // namespace dlm::data
