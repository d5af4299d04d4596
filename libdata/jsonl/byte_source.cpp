// Plain and zstd byte sources. A .zst is decompressed as it is read, so memory stays at zstd's window
// plus two buffers whatever the file's size.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <zstd.h>

#include "dlm/common/error.h"
#include "dlm/data/jsonl.h"

namespace dlm::data {
namespace {

constexpr unsigned char kZstdMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};

class FdReader {
 public:
  FdReader(const std::string& path) : path_(path) {
    if (path == "-") {
      fd_ = 0;
    } else {
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) fail_errno(path, "cannot open", errno);
      ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
  }
  ~FdReader() {
    if (fd_ > 0) ::close(fd_);
  }
  std::size_t read(char* out, std::size_t n) {
    for (;;) {
      ssize_t got = ::read(fd_, out, n);
      if (got >= 0) {
        position_ += static_cast<std::uint64_t>(got);
        return static_cast<std::size_t>(got);
      }
      if (errno != EINTR) fail_errno(path_, fmt::format("read failed at offset {}", position_), errno);
    }
  }
  // Fills `out` completely unless the input ends first.
  std::size_t read_full(char* out, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      std::size_t got = read(out + done, n - done);
      if (got == 0) break;
      done += got;
    }
    return done;
  }
  std::uint64_t position() const noexcept { return position_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t position_ = 0;
};

// Bytes already read (a sniffed magic number) come first, then the rest of the file.
class PlainSource final : public ByteSource {
 public:
  PlainSource(std::string path, std::unique_ptr<FdReader> fd, std::string head)
      : ByteSource(std::move(path)), fd_(std::move(fd)), head_(std::move(head)) {}
  std::size_t read(char* out, std::size_t n) override {
    if (head_used_ < head_.size()) {
      std::size_t k = std::min(n, head_.size() - head_used_);
      std::memcpy(out, head_.data() + head_used_, k);
      head_used_ += k;
      return k;
    }
    return fd_->read(out, n);
  }
  std::uint64_t raw_bytes_read() const noexcept override { return fd_->position(); }

 private:
  std::unique_ptr<FdReader> fd_;
  std::string head_;
  std::size_t head_used_ = 0;
};

class ZstdSource final : public ByteSource {
 public:
  ZstdSource(std::string path, std::unique_ptr<FdReader> fd, std::string head)
      : ByteSource(std::move(path)), fd_(std::move(fd)), in_(ZSTD_DStreamInSize()), dctx_(ZSTD_createDCtx()) {
    if (dctx_ == nullptr) fail_at(path_, "cannot create a zstd decompression context");
    std::memcpy(in_.data(), head.data(), head.size());
    input_ = {in_.data(), head.size(), 0};
  }
  ~ZstdSource() override { ZSTD_freeDCtx(dctx_); }

  std::size_t read(char* out, std::size_t n) override {
    ZSTD_outBuffer output{out, n, 0};
    while (output.pos == 0) {
      if (input_.pos == input_.size) {
        if (at_end_) return 0;
        std::size_t got = fd_->read(in_.data(), in_.size());
        if (got == 0) {
          at_end_ = true;
          // A frame cut short: zstd still expects bytes (its last hint was not 0).
          if (frame_open_) fail_at_offset(path_, fd_->position(), "truncated .zst: the input ends inside a frame");
          return 0;
        }
        input_ = {in_.data(), got, 0};
      }
      std::size_t hint = ZSTD_decompressStream(dctx_, &output, &input_);
      if (ZSTD_isError(hint)) {
        fail_at_offset(path_, fd_->position() - (input_.size - input_.pos),
                       fmt::format("corrupt .zst: {}", ZSTD_getErrorName(hint)));
      }
      frame_open_ = hint != 0;
    }
    return output.pos;
  }
  std::uint64_t raw_bytes_read() const noexcept override { return fd_->position(); }

 private:
  std::unique_ptr<FdReader> fd_;
  std::vector<char> in_;
  ZSTD_DCtx* dctx_;
  ZSTD_inBuffer input_{};
  bool frame_open_ = false;
  bool at_end_ = false;
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::unique_ptr<ByteSource> ByteSource::open(const std::string& path) {
  auto fd = std::make_unique<FdReader>(path);
  std::string head(4, '\0');
  head.resize(fd->read_full(head.data(), head.size()));
  bool zstd_magic = head.size() == 4 && std::memcmp(head.data(), kZstdMagic, 4) == 0;
  if (ends_with(path, ".zst") && !zstd_magic && !head.empty()) {
    fail_at_offset(path, 0, "not a zstd file: expected the zstd magic number 28 B5 2F FD");
  }
  if (zstd_magic) return std::make_unique<ZstdSource>(path, std::move(fd), std::move(head));
  return std::make_unique<PlainSource>(path, std::move(fd), std::move(head));
}

}  // namespace dlm::data
