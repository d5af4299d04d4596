// Inputs the .idx/.bin fuzzer found (tests/fuzz/indexed_fuzz.cpp): float and int64 token files whose
// values no int32 id holds were cast with undefined behaviour; now they are a dlm::Error.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "dlm/data/indexed_dataset.h"
#include "dlm/data/npy.h"

namespace {

using dlm::data::DType;

template <class T>
std::vector<std::uint8_t> bytes_of(std::vector<T> values) {
  std::vector<std::uint8_t> b(values.size() * sizeof(T));
  std::memcpy(b.data(), values.data(), b.size());
  return b;
}

TEST(FuzzRegression, WideTokensOutsideInt32AreAnError) {
  std::vector<std::int32_t> out(3);
  dlm::data::widen_tokens(DType::kFloat64, bytes_of<double>({1, 2, 50276}).data(), 3, out.data());
  EXPECT_EQ(out, (std::vector<std::int32_t>{1, 2, 50276}));
  dlm::data::widen_tokens(DType::kInt64, bytes_of<std::int64_t>({5, 0, 2147483647}).data(), 3, out.data());
  EXPECT_EQ(out, (std::vector<std::int32_t>{5, 0, 2147483647}));
  // Negative ids are refused too.
  EXPECT_THROW(dlm::data::widen_tokens(DType::kInt64, bytes_of<std::int64_t>({-5}).data(), 1, out.data()), dlm::Error);
  EXPECT_THROW(dlm::data::widen_tokens(DType::kFloat64, bytes_of<double>({1, -1.7589e124, 3}).data(), 3, out.data()), dlm::Error);
  EXPECT_THROW(dlm::data::widen_tokens(DType::kFloat32, bytes_of<float>({2147483648.0f}).data(), 1, out.data()), dlm::Error);
  EXPECT_THROW(dlm::data::widen_tokens(DType::kFloat64, bytes_of<double>({0.5}).data(), 1, out.data()), dlm::Error);
  EXPECT_THROW(dlm::data::widen_tokens(DType::kFloat64, bytes_of<double>({std::nan("")}).data(), 1, out.data()), dlm::Error);
  EXPECT_THROW(dlm::data::widen_tokens(DType::kInt64, bytes_of<std::int64_t>({std::int64_t{1} << 40}).data(), 1, out.data()), dlm::Error);
}

std::string npy_error(const std::string& bytes) {
  const auto path = std::filesystem::temp_directory_path() / ("dlm_npy_regression_" + std::to_string(::getpid()) + ".npy");
  std::ofstream(path, std::ios::binary) << bytes;
  try {
    dlm::data::NpyArray::load(path.string());
  } catch (const dlm::Error& e) {
    return e.what();
  }
  return "";
}

// npy_fuzz: a header whose length puts int64 data at an odd offset made every element load misaligned (UB).
TEST(FuzzRegression, NpyDataNotAlignedToItsElementsIsAnError) {
  static const char kFile[] = "\x93\x4e\x55\x4d\x50\x59\x01\x00\x59\x00\x7b\x27\x64\x65\x73\x63\x72\x27\x3a\x20\x27\x3c\x69\x38\x27\x2c\x20\x27\x66\x6f\x72\x74\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x46\x61\x6c\x73\x65\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x35\x2c\x20\x32\x29\x2c\x20\x7d\x20\x20\x21\x20\x20\x20\x20\x20\x20\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x54\x20\x33\x21\x20\x20\x93\x4e\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x00\x00\x00\x03\x00\xff\xff\xff\xff\xff";
  EXPECT_NE(npy_error(std::string(kFile, sizeof(kFile) - 1)).find("not aligned to its 8-byte elements"), std::string::npos);
}

// A shape whose element count wraps size_t could have matched a short file.
TEST(FuzzRegression, NpyShapeThatOverflowsIsAnError) {
  std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }";
  header.resize(118, ' ');
  header += '\n';
  const std::string file = std::string("\x93NUMPY\x01\x00", 8) + std::string(1, char(header.size())) + '\0' + header;
  EXPECT_NE(npy_error(file).find("npy shape"), std::string::npos) << npy_error(file);
}

}  // namespace
