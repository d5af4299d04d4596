#include "dlm/common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "dlm/common/error.h"

namespace dlm {

int open_regular_file(const std::string& path, struct stat& st) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer; the fstat below then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail_errno(path, "cannot open", errno);
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail_errno(path, "cannot stat", e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_at(path, S_ISDIR(st.st_mode) ? "is a folder, expected a regular file"
                                      : "not a regular file (a FIFO, socket or device), expected a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

void require_regular_file(const std::string& path) {
  struct stat st {};
  ::close(open_regular_file(path, st));
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  struct stat st {};
  const int fd = open_regular_file(path, st);
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail_errno(path, "cannot mmap", e);
    }
    data_ = static_cast<std::uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void MappedFile::advise_sequential() const noexcept {
  if (data_ != nullptr) ::madvise(data_, size_, MADV_SEQUENTIAL);
}

void MappedFile::advise_random() const noexcept {
  if (data_ != nullptr) ::madvise(data_, size_, MADV_RANDOM);
}

}  // namespace dlm
