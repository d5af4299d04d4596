#include "dlm/common/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dlm/common/error.h"
#include "dlm/common/mapped_file.h"

namespace dlm {
namespace {

std::atomic<std::uint64_t> g_temp_counter{0};

std::string parent_of(const std::string& path) {
  auto parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::string make_temp_path(const std::string& final_path) {
  std::filesystem::path p(final_path);
  std::string name = "." + p.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                     std::to_string(g_temp_counter.fetch_add(1));
  return (p.parent_path() / name).string();
}

}  // namespace

AtomicFile::AtomicFile(std::string final_path, std::size_t buffer_bytes)
    : final_path_(std::move(final_path)), temp_path_(make_temp_path(final_path_)) {
  if (final_path_.empty()) fail("output path is empty");
  if (std::filesystem::is_directory(final_path_)) fail_at(final_path_, "is a folder, expected a file path");
  // O_EXCL + O_NOFOLLOW: never write through a planted file or symlink at the temporary name.
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd_ < 0) fail_errno(final_path_, "cannot create temporary file " + temp_path_, errno);
  // Held until the file is closed: remove_stale_temporaries() on another machine sharing the folder sees
  // that the temporary is alive although its PID means nothing there.
  (void)::flock(fd_, LOCK_EX | LOCK_NB);
  buffer_.resize(buffer_bytes == 0 ? 1 : buffer_bytes);
}

AtomicFile::~AtomicFile() {
  if (!committed_) abandon();
}

void AtomicFile::write(const void* data, std::size_t size) {
  if (fd_ < 0) fail_at(final_path_, "write after commit or abandon");
  if (size == 0) return;  // an empty span may carry a null pointer, which memcpy must not see
  const char* src = static_cast<const char*>(data);
  if (size >= buffer_.size()) {
    flush();
    while (size > 0) {
      ssize_t n = ::write(fd_, src, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_errno(final_path_, "write failed", errno);
      }
      src += n;
      size -= static_cast<std::size_t>(n);
      written_ += static_cast<std::uint64_t>(n);
    }
    return;
  }
  if (buffered_ + size > buffer_.size()) flush();
  std::memcpy(buffer_.data() + buffered_, src, size);
  buffered_ += size;
  written_ += size;
}

void AtomicFile::flush() {
  const char* src = buffer_.data();
  std::size_t left = buffered_;
  while (left > 0) {
    ssize_t n = ::write(fd_, src, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(final_path_, "write failed", errno);
    }
    src += n;
    left -= static_cast<std::size_t>(n);
  }
  buffered_ = 0;
}

void AtomicFile::commit() {
  if (committed_) return;
  if (fd_ < 0) fail_at(final_path_, "commit after abandon");
  flush();
  if (::fsync(fd_) != 0) fail_errno(final_path_, "fsync failed", errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail_errno(final_path_, "close failed", errno);
  }
  fd_ = -1;
  // rename() replaces a symlink at the final name rather than following it.
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) fail_errno(final_path_, "rename failed", errno);
  committed_ = true;
  fsync_directory(parent_of(final_path_));
}

void AtomicFile::abandon() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!committed_) ::unlink(temp_path_.c_str());
}

std::size_t remove_stale_temporaries(const std::string& folder) {
  namespace fs = std::filesystem;
  std::size_t removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(folder.empty() ? "." : folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // ".NAME.tmp.PID.N", as make_temp_path names them.
    if (name.size() < 8 || name[0] != '.') continue;
    const auto counter_dot = name.rfind('.');
    const auto pid_dot = counter_dot == std::string::npos || counter_dot == 0 ? std::string::npos : name.rfind('.', counter_dot - 1);
    if (pid_dot == std::string::npos || pid_dot < 4 || name.compare(pid_dot - 4, 4, ".tmp") != 0) continue;
    const std::string pid_text = name.substr(pid_dot + 1, counter_dot - pid_dot - 1);
    const std::string counter = name.substr(counter_dot + 1);
    auto digits = [](const std::string& t) {
      return !t.empty() && t.size() < 11 && t.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(pid_text) || !digits(counter)) continue;
    const long pid = std::stol(pid_text);
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec) || it->is_symlink(type_ec)) continue;
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::unlink(it->path().c_str()) == 0) ++removed;  // no writer holds it
    ::close(fd);
  }
  return removed;
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  AtomicFile out(path, contents.size() + 1);
  out.write(contents);
  out.commit();
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno(dir, "cannot open folder for fsync", errno);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0 && e != EINVAL) fail_errno(dir, "fsync of folder failed", e);
}

std::string read_text_file(const std::string& path) {
  struct stat st {};
  const int fd = open_regular_file(path, st);
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      fail_errno(path, "read failed", e);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace dlm
