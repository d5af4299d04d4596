// MappedFile: a whole file mapped read-only into memory, for zero-copy readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

struct stat;

namespace dlm {

// Opens `path` read-only, without blocking (a FIFO named like a data file would otherwise wait forever for
// a writer), and returns the descriptor once fstat says it is a regular file; fills `st`. Throws dlm::Error
// naming the file otherwise (missing, a folder, a FIFO, a socket, a device such as /dev/zero).
int open_regular_file(const std::string& path, struct stat& st);
// The same check for readers that open the file themselves (HDF5).
void require_regular_file(const std::string& path);

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path`; throws dlm::Error naming the file when it is not a regular file or cannot be mapped.
  // An empty file maps to an empty span.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<const std::uint8_t> bytes() const noexcept { return {data_, size_}; }
  const std::string& path() const noexcept { return path_; }
  // Tells the kernel how the mapping will be read (madvise); a hint, never an error.
  void advise_sequential() const noexcept;
  void advise_random() const noexcept;

 private:
  void release() noexcept;
  std::string path_;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dlm
