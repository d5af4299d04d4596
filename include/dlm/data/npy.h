// NumPy's .npy format (version 1.0), as numpy.save writes it and numpy.load reads it.
//
//   "\x93NUMPY" | u8 major=1 | u8 minor=0 | u16 header length (LE) |
//   "{'descr': '<i4', 'fortran_order': False, 'shape': (N, 2), }" padded with spaces and a final
//   '\n' so that the data starts at a multiple of 64 bytes | the data, C order, little-endian.
// The writer reproduces numpy's header byte for byte, so dlm's cache files are numpy's cache files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dlm/common/mapped_file.h"

namespace dlm::data {

enum class NpyType : std::uint8_t { kInt8, kInt16, kInt32, kInt64, kUInt8, kUInt16, kUInt32, kUInt64 };

std::size_t npy_type_size(NpyType type);
const char* npy_type_descr(NpyType type);  // "<i4", "|u1", ...

template <typename T>
constexpr NpyType npy_type_of() {
  if constexpr (std::is_same_v<T, std::int8_t>) return NpyType::kInt8;
  else if constexpr (std::is_same_v<T, std::int16_t>) return NpyType::kInt16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return NpyType::kInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return NpyType::kInt64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return NpyType::kUInt8;
  else if constexpr (std::is_same_v<T, std::uint16_t>) return NpyType::kUInt16;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return NpyType::kUInt32;
  else {
    static_assert(std::is_same_v<T, std::uint64_t>, "npy arrays hold integers");
    return NpyType::kUInt64;
  }
}

// An integer array of rank 1 or 2: either owned (built in memory) or mapped read-only from a .npy.
class NpyArray {
 public:
  NpyArray() = default;
  template <typename T>
  static NpyArray from_vector(std::vector<T> values, std::vector<std::size_t> shape = {}) {
    NpyArray a;
    a.type_ = npy_type_of<T>();
    a.shape_ = shape.empty() ? std::vector<std::size_t>{values.size()} : std::move(shape);
    a.owned_.resize(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(a.owned_.data(), values.data(), a.owned_.size());
    a.data_ = a.owned_.data();
    return a;
  }
  // Maps `path`; throws dlm::Error naming the file and offset when it is not a well-formed .npy
  // of an integer type in C order whose data fills the file exactly.
  static NpyArray load(const std::string& path);

  NpyType type() const noexcept { return type_; }
  const std::vector<std::size_t>& shape() const noexcept { return shape_; }
  std::size_t size() const noexcept;  // elements
  const std::uint8_t* data() const noexcept { return data_; }
  std::size_t size_bytes() const noexcept { return size() * npy_type_size(type_); }

  // Element i (flat index), widened.
  std::int64_t operator[](std::size_t i) const noexcept {
    switch (type_) {
      case NpyType::kInt8: return reinterpret_cast<const std::int8_t*>(data_)[i];
      case NpyType::kInt16: return reinterpret_cast<const std::int16_t*>(data_)[i];
      case NpyType::kInt32: return reinterpret_cast<const std::int32_t*>(data_)[i];
      case NpyType::kInt64: return reinterpret_cast<const std::int64_t*>(data_)[i];
      case NpyType::kUInt8: return data_[i];
      case NpyType::kUInt16: return reinterpret_cast<const std::uint16_t*>(data_)[i];
      case NpyType::kUInt32: return reinterpret_cast<const std::uint32_t*>(data_)[i];
      case NpyType::kUInt64: return static_cast<std::int64_t>(reinterpret_cast<const std::uint64_t*>(data_)[i]);
    }
    return 0;
  }
  // Typed view; the type must match exactly.
  template <typename T>
  std::span<const T> as() const {
    check_type(npy_type_of<T>());
    return {reinterpret_cast<const T*>(data_), size()};
  }

  // Writes the array as numpy.save would, atomically (temp file, fsync, rename).
  void save(const std::string& path) const;

 private:
  void check_type(NpyType expected) const;
  NpyType type_ = NpyType::kInt64;
  std::vector<std::size_t> shape_{0};
  std::vector<std::uint8_t> owned_;
  MappedFile mapped_;
  const std::uint8_t* data_ = nullptr;
};

// numpy's header for an array (magic through the final '\n').
std::string npy_header(NpyType type, std::span<const std::size_t> shape);

}  // namespace dlm::data
