// MT19937 (Matsumoto & Nishimura 1998) as numpy's legacy RandomState seeds and advances it.
#include "dlm/data/numpy_random.h"

#include <numeric>
#include <string>

#include "dlm/common/error.h"

namespace dlm::data {

namespace {
constexpr std::uint32_t kMatrixA = 0x9908b0dfu, kUpper = 0x80000000u, kLower = 0x7fffffffu;
constexpr std::size_t kM = 397;
}  // namespace

void NumpyRandomState::seed_int(std::uint32_t seed) {
  // init_genrand: x[i] = 1812433253 * (x[i-1] ^ (x[i-1] >> 30)) + i.
  state_[0] = seed;
  for (std::size_t i = 1; i < kN; ++i) {
    const std::uint32_t prev = state_[i - 1];
    state_[i] = 1812433253u * (prev ^ (prev >> 30)) + static_cast<std::uint32_t>(i);
  }
  pos_ = kN;
}

void NumpyRandomState::seed_array(std::span<const std::uint32_t> key) {
  // init_by_array, the reference algorithm: init_genrand(19650218), then mix in the key over
  // max(N, len) steps, then N-1 more steps, and force the top bit of x[0] so the state is non-zero.
  seed_int(19650218u);
  std::size_t i = 1, j = 0;
  const std::size_t len = key.size();
  for (std::size_t k = (kN > len ? kN : len); k > 0; --k) {
    const std::uint32_t prev = state_[i - 1];
    state_[i] = (state_[i] ^ ((prev ^ (prev >> 30)) * 1664525u)) + (len ? key[j] : 0u) +
                static_cast<std::uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) { state_[0] = state_[kN - 1]; i = 1; }
    if (j >= len) j = 0;
  }
  for (std::size_t k = kN - 1; k > 0; --k) {
    const std::uint32_t prev = state_[i - 1];
    state_[i] = (state_[i] ^ ((prev ^ (prev >> 30)) * 1566083941u)) - static_cast<std::uint32_t>(i);
    ++i;
    if (i >= kN) { state_[0] = state_[kN - 1]; i = 1; }
  }
  state_[0] = 0x80000000u;
  pos_ = kN;
}

void NumpyRandomState::twist() {
  // x[i] = x[i + M] ^ twist(x[i], x[i + 1]), indices mod N, in three runs without the modulo so
  // that the compiler vectorizes them (the first reads only old words, the others words already new).
  auto step = [](std::uint32_t cur, std::uint32_t next, std::uint32_t far) {
    const std::uint32_t y = (cur & kUpper) | (next & kLower);
    return far ^ (y >> 1) ^ ((0u - (y & 1u)) & kMatrixA);
  };
  std::uint32_t* x = state_.data();
  for (std::size_t i = 0; i < kN - kM; ++i) x[i] = step(x[i], x[i + 1], x[i + kM]);
  for (std::size_t i = kN - kM; i < kN - 1; ++i) x[i] = step(x[i], x[i + 1], x[i + kM - kN]);
  x[kN - 1] = step(x[kN - 1], x[0], x[kM - 1]);
  pos_ = 0;
}

std::int64_t NumpyRandomState::randint(std::int64_t low, std::int64_t high) {
  if (low >= high) fail("randint: low >= high (" + std::to_string(low) + " >= " + std::to_string(high) + ")");
  // numpy draws an offset in [0, high - 1 - low] and adds it to low, in unsigned arithmetic.
  const std::uint64_t range = static_cast<std::uint64_t>(high - 1) - static_cast<std::uint64_t>(low);
  if (range == ~std::uint64_t{0}) return static_cast<std::int64_t>(next_uint64());
  if (range == 0xffffffffu) return static_cast<std::int64_t>(static_cast<std::uint64_t>(low) + next_uint32());
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(low) + interval(range));
}

std::vector<std::int64_t> NumpyRandomState::randint(std::int64_t low, std::int64_t high, std::size_t n) {
  if (low >= high) fail("randint: low >= high (" + std::to_string(low) + " >= " + std::to_string(high) + ")");
  std::vector<std::int64_t> out(n);
  for (auto& v : out) v = randint(low, high);
  return out;
}

std::vector<std::int64_t> NumpyRandomState::permutation(std::size_t n) {
  std::vector<std::int64_t> out(n);
  std::iota(out.begin(), out.end(), std::int64_t{0});
  shuffle(out);
  return out;
}

}  // namespace dlm::data
