// Tensor: one named host tensor (fp32, bf16 or fp16), row-major, owning its bytes.
//
// The unit every checkpoint path moves: a safetensors file is read into views of the mapping
// (TensorView, zero-copy) and written from views; the Hugging Face mapping and the native store work on
// TensorSets of owning Tensors. Master weights and Adam moments are always fp32; bf16/fp16 appear only
// at the Hugging Face boundary, converted with round-to-nearest-even.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlm/ckpt/model_config.h"

namespace dlm::ckpt {

std::size_t dtype_size(TensorDType dtype);
// safetensors' spelling: "F32", "BF16", "F16".
std::string_view dtype_name(TensorDType dtype);
// Accepts "F32"/"BF16"/"F16" and the command-line forms "fp32"/"bf16"/"fp16"; false for anything else.
bool parse_dtype(std::string_view name, TensorDType& out);

std::int64_t element_count(std::span<const std::int64_t> shape);

// A read-only view: bytes usually point into a mapped file.
struct TensorView {
  std::string name;
  TensorDType dtype = TensorDType::kFloat32;
  std::vector<std::int64_t> shape;
  std::span<const std::uint8_t> bytes;
};

struct Tensor {
  std::string name;
  TensorDType dtype = TensorDType::kFloat32;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;

  // A zero-filled fp32 tensor.
  static Tensor zeros(std::string name, std::vector<std::int64_t> shape, TensorDType dtype = TensorDType::kFloat32);
  // Copies a view's bytes.
  static Tensor copy_of(const TensorView& view);

  std::int64_t numel() const { return element_count(shape); }
  TensorView view() const { return {name, dtype, shape, bytes}; }
  // The elements as fp32; throws dlm::Error when the tensor is not fp32.
  std::span<float> f32();
  std::span<const float> f32() const;
};

// Converts to another dtype (fp32 -> bf16/fp16 rounds to nearest even; widening is exact).
Tensor convert(const TensorView& view, TensorDType to);

// Tensors by name; ordered, so files written from one are reproducible.
using TensorSet = std::map<std::string, Tensor>;

}  // namespace dlm::ckpt
