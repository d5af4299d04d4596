// NpyOutput<T>: an index array built where it will be kept, so no copy of it is ever made.
//
// With a path, the array is the data of a temporary .npy in the cache folder, mapped shared: the
// builder shuffles and fills the file's pages directly, and commit() unmaps, fsyncs and renames it
// into place (as AtomicFile does) and maps it back read-only, so the pages already in the page
// cache serve the trainer without ever counting twice. Without a path it is plain memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dlm/data/npy.h"

namespace dlm::data::detail {

// The mapped temporary file behind an NpyOutput (type-erased).
class MappedNpyFile {
 public:
  MappedNpyFile(std::string path, NpyType type, std::vector<std::size_t> shape);
  ~MappedNpyFile();
  MappedNpyFile(const MappedNpyFile&) = delete;
  MappedNpyFile& operator=(const MappedNpyFile&) = delete;

  std::uint8_t* data() const noexcept { return data_; }
  NpyArray commit();

 private:
  void unmap() noexcept;
  std::string path_, temp_path_;
  int fd_ = -1;
  std::uint8_t* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  std::uint8_t* data_ = nullptr;
  bool committed_ = false;
};

template <typename T>
class NpyOutput {
 public:
  // path empty: in memory.
  NpyOutput(const std::string& path, std::vector<std::size_t> shape) : shape_(std::move(shape)) {
    std::size_t n = 1;
    for (auto d : shape_) n *= d;
    if (path.empty()) {
      memory_.resize(n);
      data_ = {memory_.data(), n};
    } else {
      file_ = std::make_unique<MappedNpyFile>(path, npy_type_of<T>(), shape_);
      data_ = {reinterpret_cast<T*>(file_->data()), n};
    }
  }

  std::span<T> data() const noexcept { return data_; }
  T& operator[](std::size_t i) const noexcept { return data_[i]; }
  std::size_t size() const noexcept { return data_.size(); }

  // The finished array: mapped from its final file, or the memory. The output is spent.
  NpyArray commit() {
    data_ = {};
    if (file_) return file_->commit();
    return NpyArray::from_vector(std::move(memory_), shape_);
  }

 private:
  std::vector<std::size_t> shape_;
  std::vector<T> memory_;
  std::unique_ptr<MappedNpyFile> file_;
  std::span<T> data_;
};

}  // namespace dlm::data::detail
