#include "npy_output.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <new>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"

namespace dlm::data::detail {

namespace {
std::atomic<std::uint64_t> g_counter{0};
}  // namespace

MappedNpyFile::MappedNpyFile(std::string path, NpyType type, std::vector<std::size_t> shape) : path_(std::move(path)) {
  const std::filesystem::path p(path_);
  temp_path_ = (p.parent_path() / ("." + p.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                                   std::to_string(g_counter.fetch_add(1))))
                   .string();
  const std::string header = npy_header(type, shape);
  std::size_t bytes = npy_type_size(type);
  for (auto d : shape) bytes *= d;
  map_bytes_ = header.size() + bytes;
  // O_EXCL + O_NOFOLLOW: never write through a planted file or symlink at the temporary name.
  fd_ = ::open(temp_path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd_ < 0) fail_errno(path_, "cannot create temporary file " + temp_path_, errno);
  // posix_fallocate reserves the blocks now, so a full disk is an error here and not a SIGBUS later.
  if (const int e = ::posix_fallocate(fd_, 0, static_cast<off_t>(map_bytes_)); e != 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
    fail_errno(path_, "cannot reserve " + std::to_string(map_bytes_) + " bytes", e);
  }
  void* m = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) {
    const int e = errno;
    ::close(fd_);
    ::unlink(temp_path_.c_str());
    if (e == ENOMEM) throw std::bad_alloc();  // no address space left (RLIMIT_AS): the tool says so
    fail_errno(path_, "cannot map " + temp_path_, e);
  }
  map_ = static_cast<std::uint8_t*>(m);
  std::copy(header.begin(), header.end(), map_);
  data_ = map_ + header.size();
}

MappedNpyFile::~MappedNpyFile() {
  unmap();
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void MappedNpyFile::unmap() noexcept {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = data_ = nullptr;
}

NpyArray MappedNpyFile::commit() {
  unmap();
  if (::fsync(fd_) != 0) fail_errno(path_, "fsync failed", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail_errno(path_, "close failed", errno);
  // rename() replaces a symlink at the final name rather than following it.
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail_errno(path_, "rename failed", errno);
  committed_ = true;
  fsync_directory(std::filesystem::path(path_).parent_path().string());
  return NpyArray::load(path_);
}

}  // namespace dlm::data::detail
