#include <algorithm>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/backend.h"

namespace dlm::train {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kU8: return "u8";
  }
  return "?";
}

static std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, std::vector<std::int64_t> shape, DType dtype, std::size_t byte_offset)
    : buffer_(std::move(buffer)), shape_(std::move(shape)), dtype_(dtype), offset_(byte_offset) {
  for (auto d : shape_)
    if (d < 0) fail(fmt::format("tensor: negative dimension {}", d));
  if (buffer_ && offset_ + bytes() > buffer_->bytes())
    fail(fmt::format("tensor: {} bytes at offset {} exceed a buffer of {}", bytes(), offset_, buffer_->bytes()));
}

std::int64_t Tensor::numel() const { return product(shape_); }

Tensor Tensor::reshape(std::vector<std::int64_t> shape) const {
  if (product(shape) != numel())
    fail(fmt::format("tensor: cannot reshape {} elements to {} elements", numel(), product(shape)));
  return Tensor(buffer_, std::move(shape), dtype_, offset_);
}

Tensor Tensor::rows(std::int64_t first, std::int64_t count) const {
  if (shape_.empty() || first < 0 || count < 0 || first + count > shape_[0])
    fail(fmt::format("tensor: rows [{}, {}) outside {} rows", first, first + count, shape_.empty() ? 0 : shape_[0]));
  std::vector<std::int64_t> shape = shape_;
  shape[0] = count;
  const auto row_bytes = static_cast<std::size_t>(numel() / std::max<std::int64_t>(shape_[0], 1)) * dtype_size(dtype_);
  return Tensor(buffer_, std::move(shape), dtype_, offset_ + static_cast<std::size_t>(first) * row_bytes);
}

void* Tensor::data() const {
  return buffer_ ? static_cast<std::uint8_t*>(buffer_->data()) + offset_ : nullptr;
}

std::span<float> f32_elements(const Tensor& t) {
  if (t.dtype() != DType::kF32) fail(fmt::format("a collective over {} data: only f32 tensors are exchanged", dtype_name(t.dtype())));
  return {static_cast<float*>(t.data()), static_cast<std::size_t>(t.numel())};
}

}  // namespace dlm::train
