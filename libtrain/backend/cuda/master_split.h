// An fp32 master weight kept as two 16-bit halves, so that the bf16 weights the GEMMs read are the upper half
// and no separate bf16 copy is written beside the master weights (AdamW moves 28 bytes a parameter instead of
// 30; the model holds 2 bytes a parameter less):
//   hi = the fp32 bits rounded to their upper 16 (to nearest, ties away from zero: a bf16)
//   lo = bits - (hi << 16), in [-2^15, 2^15): a signed 16-bit remainder
//   bits = (hi << 16) + lo   (32-bit wrap-around), exactly the fp32 master weight again.
// Ties away from zero rather than to even: a tie (lower half exactly 0x8000) rounded down would leave a
// remainder of +2^15, one past int16. The bf16 weight then differs from round-to-nearest-even only at ties,
// 1 in 65536 values, by one bf16 step. NaN stays NaN (quiet), Inf stays Inf.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DLM_HOST_DEVICE __host__ __device__
#else
#define DLM_HOST_DEVICE
#endif

namespace dlm::train::cuda {

struct MasterHalves {
  std::uint16_t hi;  // bf16 bits
  std::int16_t lo;
};

DLM_HOST_DEVICE inline MasterHalves split_master_bits(std::uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {static_cast<std::uint16_t>((bits >> 16) | 0x40u), 0};
  const std::uint32_t hi = (bits + 0x8000u) >> 16;
  return {static_cast<std::uint16_t>(hi), static_cast<std::int16_t>(static_cast<std::int32_t>(bits - (hi << 16)))};
}

DLM_HOST_DEVICE inline std::uint32_t join_master_bits(std::uint16_t hi, std::int16_t lo) {
  return (static_cast<std::uint32_t>(hi) << 16) + static_cast<std::uint32_t>(static_cast<std::int32_t>(lo));
}

}  // namespace dlm::train::cuda

#undef DLM_HOST_DEVICE
