#include "host_snapshot.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train {
namespace {

constexpr std::size_t kAlign = 4096;
constexpr std::size_t kPiece = 64u << 20;  // the unit a copy thread takes
// Copy threads: memory bandwidth, not cores, is the limit past a few.
constexpr unsigned kMaxCopyThreads = 8;

std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

std::vector<std::span<const float>> HostSnapshot::take(const std::vector<std::span<const float>>& spans) {
  std::size_t total = 0;
  for (const auto& s : spans) total += round_up(s.size_bytes());
  if (total > bytes_) {
    buffer_.reset();
    buffer_.reset(static_cast<std::byte*>(std::aligned_alloc(kAlign, std::max(total, kAlign))));
    if (!buffer_) fail(fmt::format("checkpoint snapshot: cannot allocate {} bytes of host memory", total));
    bytes_ = total;
  }
  struct Copy {
    std::byte* to;
    const std::byte* from;
    std::size_t n;
  };
  std::vector<Copy> copies;
  std::vector<std::span<const float>> out;
  std::size_t at = 0;
  for (const auto& s : spans) {
    std::byte* to = buffer_.get() + at;
    const auto* from = reinterpret_cast<const std::byte*>(s.data());
    for (std::size_t done = 0; done < s.size_bytes(); done += kPiece)
      copies.push_back({to + done, from + done, std::min(kPiece, s.size_bytes() - done)});
    out.emplace_back(reinterpret_cast<const float*>(to), s.size());
    at += round_up(s.size_bytes());
  }
  std::atomic<std::size_t> next{0};
  const auto copy = [&] {
    for (std::size_t i = next++; i < copies.size(); i = next++) std::memcpy(copies[i].to, copies[i].from, copies[i].n);
  };
  std::vector<std::thread> threads;
  const unsigned count = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), kMaxCopyThreads);
  try {
    for (unsigned t = 1; t < count && t < copies.size(); ++t) threads.emplace_back(copy);
  } catch (const std::system_error&) {
    // Fewer threads than asked: this one copies what the others leave.
  }
  copy();
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace dlm::train
