// The checkpoint checksum is XXH64: its values must be the reference library's (libxxhash 0.8.1).
#include "../../libckpt/hash.h"

#include <string>

#include <gtest/gtest.h>

namespace {

TEST(Xxh64, MatchesTheReferenceImplementation) {
  using dlm::ckpt::detail::xxh64;
  EXPECT_EQ(xxh64("", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(xxh64("abc", 3), 0x44bc2cf5ad770999ull);
  std::string s;
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  s += "xyz";  // 771 bytes: the 32-byte lanes, 8-byte, 4-byte and 1-byte tails
  EXPECT_EQ(xxh64(s.data(), s.size()), 0xe921a1b45bd779f8ull);
  EXPECT_EQ(dlm::ckpt::detail::checksum_string("abc", 3), "xxh64:44bc2cf5ad770999");
}

}  // namespace
