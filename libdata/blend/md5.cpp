// MD5 from RFC 1321: 64-byte blocks, four rounds of 16 steps, little-endian words.
#include "md5.h"

#include <array>
#include <cstdint>
#include <cstring>

namespace dlm::data::detail {

namespace {
constexpr std::array<std::uint32_t, 64> kSines = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};
constexpr std::array<int, 16> kShifts = {7, 12, 17, 22, 5, 9, 14, 20, 4, 11, 16, 23, 6, 10, 15, 21};

std::uint32_t rotl(std::uint32_t x, int s) { return (x << s) | (x >> (32 - s)); }

void block(std::array<std::uint32_t, 4>& h, const unsigned char* p) {
  std::uint32_t m[16];
  for (int i = 0; i < 16; ++i)
    m[i] = p[4 * i] | (std::uint32_t{p[4 * i + 1]} << 8) | (std::uint32_t{p[4 * i + 2]} << 16) |
           (std::uint32_t{p[4 * i + 3]} << 24);
  std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
  for (int i = 0; i < 64; ++i) {
    std::uint32_t f;
    int g;
    switch (i / 16) {
      case 0: f = (b & c) | (~b & d); g = i; break;
      case 1: f = (d & b) | (~d & c); g = (5 * i + 1) % 16; break;
      case 2: f = b ^ c ^ d; g = (3 * i + 5) % 16; break;
      default: f = c ^ (b | ~d); g = (7 * i) % 16; break;
    }
    const std::uint32_t next = b + rotl(a + f + kSines[i] + m[g], kShifts[(i / 16) * 4 + i % 4]);
    a = d;
    d = c;
    c = b;
    b = next;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d;
}
}  // namespace

std::string md5_hex(std::string_view text) {
  std::array<std::uint32_t, 4> h = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t n = text.size();
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) block(h, p + i);
  // Padding: 0x80, zeros to 56 mod 64, then the bit length as a 64-bit little-endian integer.
  unsigned char tail[128] = {};
  const std::size_t rest = n - i;
  if (rest) std::memcpy(tail, p + i, rest);
  tail[rest] = 0x80;
  const std::size_t tail_len = rest < 56 ? 64 : 128;
  const std::uint64_t bits = static_cast<std::uint64_t>(n) * 8;
  for (int k = 0; k < 8; ++k) tail[tail_len - 8 + k] = static_cast<unsigned char>(bits >> (8 * k));
  block(h, tail);
  if (tail_len == 128) block(h, tail + 64);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (auto word : h)
    for (int k = 0; k < 4; ++k) {
      const auto byte = static_cast<unsigned char>(word >> (8 * k));
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  return out;
}

}  // namespace dlm::data::detail
