// UnalignedArray<T>: a read-only view of T values stored at any byte address (e.g. inside a mapped
// file whose layout does not align them, such as the int32 lengths at offset 34 of a Megatron .idx).
// Each read is a memcpy, which compilers turn into a plain load on x86 and ARM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace dlm {

template <typename T>
class UnalignedArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  UnalignedArray() = default;
  UnalignedArray(const std::uint8_t* data, std::size_t count) : data_(data), count_(count) {}

  std::size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }
  T operator[](std::size_t i) const noexcept {
    T v;
    std::memcpy(&v, data_ + i * sizeof(T), sizeof(T));
    return v;
  }
  T front() const noexcept { return (*this)[0]; }
  T back() const noexcept { return (*this)[count_ - 1]; }
  const std::uint8_t* bytes() const noexcept { return data_; }
  std::vector<T> to_vector() const {
    std::vector<T> out(count_);
    if (count_ != 0) std::memcpy(out.data(), data_, count_ * sizeof(T));
    return out;
  }

 private:
  const std::uint8_t* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace dlm
