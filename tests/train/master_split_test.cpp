// The CUDA backend's master weights as two 16-bit halves (libtrain/backend/cuda/master_split.h): the halves
// must give back every fp32 bit pattern exactly, and the upper half must be the bf16 rounding to nearest
// (ties away from zero, where round-to-nearest-even would round a tie down).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda/master_split.h"

namespace dlm::train::cuda {
namespace {

// bf16 by round-to-nearest-even, the usual bit form (finite values).
std::uint16_t bf16_rne(std::uint32_t bits) {
  return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

void expect_round_trip(std::uint32_t bits) {
  const MasterHalves h = split_master_bits(bits);
  EXPECT_EQ(join_master_bits(h.hi, h.lo), bits) << std::hex << bits;
  const std::uint32_t low = bits & 0xffffu;
  if (low == 0x8000u) EXPECT_EQ(h.hi, (bits >> 16) + 1) << "a tie rounds away from zero: " << std::hex << bits;
  else EXPECT_EQ(h.hi, bf16_rne(bits)) << std::hex << bits;
}

TEST(MasterSplit, EveryFiniteValueComesBackExactly) {
  std::mt19937 rng(1);
  for (int i = 0; i < 1'000'000; ++i) {
    std::uint32_t bits = rng();
    if ((bits & 0x7fffffffu) >= 0x7f800000u) bits &= 0xbfffffffu;  // NaN or Inf: exponent lowered, finite
    expect_round_trip(bits);
  }
  // Lower halves at and around the tie, in both signs, at binade edges (a carry into the exponent).
  for (std::uint32_t upper : {0x3f80u, 0x3f7fu, 0xbf7fu, 0x0000u, 0x8000u, 0x7f7fu, 0xff7fu, 0x0080u, 0x007fu})
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      expect_round_trip(upper << 16 | low);
}

TEST(MasterSplit, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), 1.0f, -3.14159265f}) {
    const auto bits = std::bit_cast<std::uint32_t>(x);
    const MasterHalves h = split_master_bits(bits);
    EXPECT_EQ(join_master_bits(h.hi, h.lo), bits) << x;
  }
  // Infinity's upper half is bf16 infinity; the largest float rounds to it, as round-to-nearest-even does.
  EXPECT_EQ(split_master_bits(std::bit_cast<std::uint32_t>(inf)).hi, 0x7f80u);
  EXPECT_EQ(split_master_bits(std::bit_cast<std::uint32_t>(std::numeric_limits<float>::max())).hi, 0x7f80u);
  // NaN stays NaN (quiet) in the bf16 weight and in the master weight.
  for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffffffffu}) {
    const MasterHalves h = split_master_bits(nan);
    EXPECT_EQ(h.hi & 0x7f80u, 0x7f80u);
    EXPECT_NE(h.hi & 0x007fu, 0u);
    EXPECT_TRUE(std::isnan(std::bit_cast<float>(join_master_bits(h.hi, h.lo))));
  }
}

}  // namespace
}  // namespace dlm::train::cuda
