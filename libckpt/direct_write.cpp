// write_extents (h5.h): large checkpoint writes through O_DIRECT with a double buffer, so that copying
// the next chunk (and hashing it) overlaps the write of the current one.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "h5.h"
#include "hash.h"

namespace dlm::ckpt::detail {
namespace {

constexpr std::size_t kAlign = 4096;
constexpr std::size_t kChunk = 32u << 20;
constexpr std::size_t kMinDirect = 4u << 20;

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
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
}

struct AlignedBuffer {
  std::uint8_t* p = static_cast<std::uint8_t*>(std::aligned_alloc(kAlign, kChunk));
  ~AlignedBuffer() { std::free(p); }
};

}  // namespace

std::vector<std::string> write_extents(const std::string& path, const std::vector<Extent>& extents) {
  Fd buffered{::open(path.c_str(), O_WRONLY | O_CLOEXEC)};
  if (buffered.fd < 0) fail_errno(path, "open", errno);
  Fd direct{::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT)};  // -1 where unsupported (tmpfs)
  std::vector<std::string> sums(extents.size());
  AlignedBuffer buffers[2];
  std::future<void> pending;
  int next = 0;
  for (std::size_t e = 0; e < extents.size(); ++e) {
    const Extent& x = extents[e];
    auto hash = std::async(std::launch::deferred, [&] { return checksum_string(x.data, x.size); });
    // The aligned middle goes through O_DIRECT; a head before the first 4 KiB boundary and the tail
    // after the last one are written buffered.
    std::uint64_t begin = x.offset, end = x.offset + x.size;
    std::uint64_t a = (begin + kAlign - 1) / kAlign * kAlign, b = end / kAlign * kAlign;
    // Small extents go buffered: a synchronous O_DIRECT write per norm vector would cost a disk round trip each.
    if (direct.fd < 0 || b < a + kMinDirect) a = b = begin;  // everything buffered (as the "tail")
    if (a > begin) pwrite_all(buffered.fd, x.data, a - begin, begin, path);
    if (end > b) pwrite_all(buffered.fd, x.data + (b - begin), end - b, b, path);
    for (std::uint64_t at = a; at < b; at += kChunk) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, b - at));
      std::memcpy(buffers[next].p, x.data + (at - begin), n);
      if (pending.valid()) pending.get();
      pending = std::async(std::launch::async, [&, at, n, buf = buffers[next].p] { pwrite_all(direct.fd, buf, n, at, path); });
      next ^= 1;
    }
    sums[e] = hash.get();
  }
  if (pending.valid()) pending.get();
  if (::fsync(buffered.fd) != 0) fail_errno(path, "fsync", errno);  // per inode: covers both descriptors
  return sums;
}

}  // namespace dlm::ckpt::detail
