#include "dlm/ckpt/tensor.h"

#include <bit>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::ckpt {
namespace {

// bf16 is the top half of an fp32; rounding adds 0x7fff plus the lowest kept bit (ties to even).
std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // stay a (quiet) NaN
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<std::uint16_t>(u >> 16);
}

float bf16_to_f32(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t{h} << 16); }

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

std::uint16_t f32_to_f16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds past the largest half (65504) to infinity
  if (a < 6.103515625e-05f) {               // subnormal half: units of 2^-24, nearbyint ties to even
    return sign | static_cast<std::uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  std::uint32_t bits = std::bit_cast<std::uint32_t>(a);
  bits += 0xfff + ((bits >> 13) & 1);  // round the 13 dropped mantissa bits to nearest even
  return sign | static_cast<std::uint16_t>(((bits >> 23) - 112) << 10 | ((bits >> 13) & 0x3ffu));
}

float load_as_f32(const std::uint8_t* p, TensorDType dtype) {
  if (dtype == TensorDType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == TensorDType::kBFloat16 ? bf16_to_f32(h) : f16_to_f32(h);
}

void store_from_f32(std::uint8_t* p, TensorDType dtype, float f) {
  if (dtype == TensorDType::kFloat32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const std::uint16_t h = dtype == TensorDType::kBFloat16 ? f32_to_bf16(f) : f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

}  // namespace

std::size_t dtype_size(TensorDType dtype) { return dtype == TensorDType::kFloat32 ? 4 : 2; }

std::string_view dtype_name(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::kFloat32: return "F32";
    case TensorDType::kBFloat16: return "BF16";
    case TensorDType::kFloat16: return "F16";
  }
  return "?";
}

bool parse_dtype(std::string_view name, TensorDType& out) {
  if (name == "F32" || name == "fp32" || name == "float32") out = TensorDType::kFloat32;
  else if (name == "BF16" || name == "bf16" || name == "bfloat16") out = TensorDType::kBFloat16;
  else if (name == "F16" || name == "fp16" || name == "float16") out = TensorDType::kFloat16;
  else return false;
  return true;
}

std::int64_t element_count(std::span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::zeros(std::string name, std::vector<std::int64_t> shape, TensorDType dtype) {
  Tensor t{std::move(name), dtype, std::move(shape), {}};
  t.bytes.assign(static_cast<std::size_t>(t.numel()) * dtype_size(dtype), 0);
  return t;
}

Tensor Tensor::copy_of(const TensorView& v) {
  return Tensor{v.name, v.dtype, v.shape, std::vector<std::uint8_t>(v.bytes.begin(), v.bytes.end())};
}

std::span<float> Tensor::f32() {
  if (dtype != TensorDType::kFloat32) fail(fmt::format("tensor {} is {}, expected F32", name, dtype_name(dtype)));
  return {reinterpret_cast<float*>(bytes.data()), bytes.size() / 4};
}

std::span<const float> Tensor::f32() const {
  if (dtype != TensorDType::kFloat32) fail(fmt::format("tensor {} is {}, expected F32", name, dtype_name(dtype)));
  return {reinterpret_cast<const float*>(bytes.data()), bytes.size() / 4};
}

Tensor convert(const TensorView& v, TensorDType to) {
  if (v.dtype == to) return Tensor::copy_of(v);
  Tensor out = Tensor::zeros(v.name, v.shape, to);
  const std::size_t n = static_cast<std::size_t>(out.numel()), in_size = dtype_size(v.dtype), out_size = dtype_size(to);
  if (v.bytes.size() != n * in_size) fail(fmt::format("tensor {}: {} bytes for {} elements", v.name, v.bytes.size(), n));
  for (std::size_t i = 0; i < n; ++i) store_from_f32(out.bytes.data() + i * out_size, to, load_as_f32(v.bytes.data() + i * in_size, v.dtype));
  return out;
}

}  // namespace dlm::ckpt
