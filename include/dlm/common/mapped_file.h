// MappedFile: a whole file mapped read-only into memory, for zero-copy readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace dlm {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path`; throws dlm::Error naming the file when it cannot be opened or mapped.
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
