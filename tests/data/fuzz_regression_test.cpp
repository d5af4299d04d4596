// Inputs the .idx/.bin fuzzer found (tests/fuzz/indexed_fuzz.cpp): float and int64 token files whose
// values no int32 id holds were cast with undefined behaviour; now they are a dlm::Error.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "dlm/data/indexed_dataset.h"

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
  dlm::data::widen_tokens(DType::kInt64, bytes_of<std::int64_t>({-5, 0, 2147483647}).data(), 3, out.data());
  EXPECT_EQ(out, (std::vector<std::int32_t>{-5, 0, 2147483647}));
  EXPECT_THROW(dlm::data::widen_tokens(DType::kFloat64, bytes_of<double>({1, -1.7589e124, 3}).data(), 3, out.data()), dlm::Error);
  EXPECT_THROW(dlm::data::widen_tokens(DType::kFloat32, bytes_of<float>({2147483648.0f}).data(), 1, out.data()), dlm::Error);
  EXPECT_THROW(dlm::data::widen_tokens(DType::kFloat64, bytes_of<double>({0.5}).data(), 1, out.data()), dlm::Error);
  EXPECT_THROW(dlm::data::widen_tokens(DType::kFloat64, bytes_of<double>({std::nan("")}).data(), 1, out.data()), dlm::Error);
  EXPECT_THROW(dlm::data::widen_tokens(DType::kInt64, bytes_of<std::int64_t>({std::int64_t{1} << 40}).data(), 1, out.data()), dlm::Error);
}

}  // namespace
