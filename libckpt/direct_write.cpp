// write_extents (h5.h): a shard file's tensor bytes through O_DIRECT from several threads at once, each
// writing whole 32 MiB pieces at their offsets. Several writes in flight keep the device's queue full where one
// synchronous write at a time (dd's way) leaves it idle between requests; a piece whose memory is 4 KiB-aligned
// is written from that memory, any other is first copied into the thread's aligned buffer (that copy overlaps
// the other threads' writes). The checksums are computed by the calling thread over the same memory meanwhile.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <system_error>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "h5.h"
#include "hash.h"

namespace dlm::ckpt::detail {
namespace {

constexpr std::size_t kAlign = 4096;
constexpr std::size_t kChunk = 32u << 20;
// Below this an extent goes through the page cache: a synchronous O_DIRECT write per norm vector would cost a
// disk round trip each.
constexpr std::size_t kMinDirect = 4u << 20;
// Writes in flight at once (threads). More than the device needs only costs their buffers (32 MiB each).
constexpr int kWriters = 4;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void pwrite_all(int fd, const std::uint8_t* p, std::size_t n, std::uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, fmt::format("write at offset {}", offset), errno);
    }
    if (w == 0) fail_at(path, fmt::format("write at offset {} wrote nothing", offset));
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
}

struct AlignedBuffer {
  std::uint8_t* p = nullptr;
  ~AlignedBuffer() { std::free(p); }
  std::uint8_t* get() {
    if (!p) p = static_cast<std::uint8_t*>(std::aligned_alloc(kAlign, kChunk));
    if (!p) fail("checkpoint save: cannot allocate a 32 MiB write buffer");
    return p;
  }
};

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kAlign == 0; }

// One O_DIRECT write: `n` bytes (a multiple of kAlign) from `src` to file offset `at` (aligned).
struct Piece {
  std::uint64_t at = 0;
  const std::uint8_t* src = nullptr;
  std::size_t n = 0;
};

}  // namespace

std::vector<std::string> write_extents(const std::string& path, const std::vector<Extent>& extents) {
  Fd buffered{::open(path.c_str(), O_WRONLY | O_CLOEXEC)};
  if (buffered.fd < 0) fail_errno(path, "open", errno);
  Fd direct{::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT)};  // -1 where unsupported (tmpfs)
  std::vector<Piece> pieces;
  for (const Extent& x : extents) {
    // The aligned middle goes through O_DIRECT; a head before the first 4 KiB boundary and the tail after the
    // last one are written buffered.
    std::uint64_t begin = x.offset, end = x.offset + x.size;
    std::uint64_t a = (begin + kAlign - 1) / kAlign * kAlign, b = end / kAlign * kAlign;
    if (direct.fd < 0 || b < a + kMinDirect) a = b = begin;  // everything buffered (as the "tail")
    if (a > begin) pwrite_all(buffered.fd, x.data, a - begin, begin, path);
    if (end > b) pwrite_all(buffered.fd, x.data + (b - begin), end - b, b, path);
    for (std::uint64_t at = a; at < b; at += kChunk)
      pieces.push_back({at, x.data + (at - begin), static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, b - at))});
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto writer = [&] {
    try {
      AlignedBuffer buffer;
      for (std::size_t i = next++; i < pieces.size() && !failed; i = next++) {
        const Piece& piece = pieces[i];
        const std::uint8_t* src = piece.src;
        if (!aligned(src)) {
          std::memcpy(buffer.get(), src, piece.n);
          src = buffer.get();
        }
        pwrite_all(direct.fd, src, piece.n, piece.at, path);
      }
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> threads;
  try {
    for (int t = 0; t < kWriters && static_cast<std::size_t>(t) < pieces.size(); ++t) threads.emplace_back(writer);
  } catch (const std::system_error&) {
    // Fewer writers than asked (a thread limit): this thread takes what the others leave, below.
  }
  std::vector<std::string> sums(extents.size());
  for (std::size_t e = 0; e < extents.size() && !failed; ++e) sums[e] = checksum_string(extents[e].data, extents[e].size);
  writer();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  if (::fsync(buffered.fd) != 0) fail_errno(path, "fsync", errno);  // per inode: covers both descriptors
  return sums;
}

}  // namespace dlm::ckpt::detail
