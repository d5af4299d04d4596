// NumpyPcg64 against numbers numpy 2 printed: default_rng(seed).bit_generator.random_raw() and integers(..., int32).
#include <algorithm>

#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "dlm/data/mock_dataset.h"
#include "dlm/data/numpy_generator.h"

namespace dlm::data {
namespace {

TEST(NumpyPcg64, RawOutputsOfSeedSequenceSeeds) {
  NumpyPcg64 zero(0);
  EXPECT_EQ(zero.next_uint64(), 11749869230777074271ull);
  EXPECT_EQ(zero.next_uint64(), 4976686463289251617ull);
  NumpyPcg64 wide((std::uint64_t{1} << 40) + 7);  // a seed of two 32-bit words
  EXPECT_EQ(wide.next_uint64(), 15307346044642009514ull);
  EXPECT_EQ(wide.next_uint64(), 4709548916763817589ull);
}

TEST(NumpyPcg64, BoundedInt32IsNumpysLemireDraw) {
  EXPECT_EQ(NumpyPcg64(5).integers_int32(-3, 2147483647, 4),
            (std::vector<std::int32_t>{1728730613, 48647415, 1006851805, 1106653213}));
  // MockGPTLowLevelDataset's first lengths: default_rng(0).integers(1, 4096, 100000, numpy.int32).
  const auto lengths = mock_sequence_lengths();
  ASSERT_EQ(lengths.size(), 100000u);
  EXPECT_EQ(std::vector<std::int32_t>(lengths.begin(), lengths.begin() + 10),
            (std::vector<std::int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331}));
}

// Document d of the mock data is 1, 2, ..., L[d] - 1 (mod the vocabulary), then eod: a split's samples, read in
// order of the sample index, are those documents packed.
TEST(MockGptDataset, SamplesAreTheMockDocumentsPacked) {
  GptIndexConfig config;
  config.sequence_length = 64;
  const MockGptDataset ds(0, 10, std::nullopt, config, MockTokens{50, 50});
  std::vector<std::int32_t> raw;
  ds.raw_tokens(0, raw);
  ASSERT_EQ(raw.size(), 65u);
  const auto& index = ds.index();
  const auto row = static_cast<std::size_t>(index.shuffle_index[0]);
  const auto doc = static_cast<std::size_t>(index.document_index[static_cast<std::size_t>(index.sample_index[2 * row])]);
  const std::int64_t offset = index.sample_index[2 * row + 1], length = mock_sequence_lengths()[doc];
  for (std::int64_t k = offset; k < std::min<std::int64_t>(length, offset + 65); ++k)
    EXPECT_EQ(raw[static_cast<std::size_t>(k - offset)], k == length - 1 ? 50 : (k + 1) % 50) << k;
  EXPECT_THROW(ds.raw_tokens(ds.size(), raw), Error);
}

}  // namespace
}  // namespace dlm::data
