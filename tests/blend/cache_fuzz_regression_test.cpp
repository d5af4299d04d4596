// Inputs the blend-cache fuzzer found (tests/fuzz/blend_cache_fuzz.cpp), each a damaged cache file
// that a reader must refuse (or rebuild) in one line.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "dlm/data/npy.h"

namespace {

std::string npy_error(const std::string& header_dict) {
  std::string header = header_dict;
  header.resize(117, ' ');
  header += '\n';
  const std::string file = std::string("\x93NUMPY\x01\x00", 8) + char(header.size()) + '\0' + header;
  const auto path = std::filesystem::temp_directory_path() / ("dlm_blend_regression_" + std::to_string(::getpid()) + ".npy");
  std::ofstream(path, std::ios::binary) << file;
  std::string message;
  try {
    dlm::data::NpyArray::load(path.string());
  } catch (const dlm::Error& e) {
    message = e.what();
  }
  std::filesystem::remove(path);
  return message;
}

// blend_cache_fuzz: a cached sample_index.npy whose shape held a newline and bytes past ASCII made the
// "index cache is unusable (npy shape ...)" message span lines (and carry raw bytes).
TEST(BlendCacheFuzz, DamagedNpyHeaderFieldsAreEscapedOnOneLine) {
  const std::string shape = npy_error("{'descr': '<i4', 'fortran_order': False, 'shape': (5\x81\nA\t;X), }");
  EXPECT_NE(shape.find("npy shape (5\\x81\\x0aA\\x09;X) is malformed"), std::string::npos) << shape;
  const std::string descr = npy_error("{'descr': '<i\r4', 'fortran_order': False, 'shape': (5,), }");
  EXPECT_NE(descr.find("npy dtype '<i\\x0d4' is not a little-endian integer"), std::string::npos) << descr;
  // A long field is cut at 48 bytes.
  const std::string longer = npy_error("{'descr': '<i4', 'fortran_order': False, 'shape': (" + std::string(60, 'x') + "), }");
  EXPECT_NE(longer.find("npy shape (" + std::string(47, 'x') + "... is malformed"), std::string::npos) << longer;
  for (const auto& m : {shape, descr, longer})
    for (const char c : m) EXPECT_GE(static_cast<unsigned char>(c), 0x20) << m;
}

}  // namespace
