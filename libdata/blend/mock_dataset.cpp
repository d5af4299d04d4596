// MockGPTLowLevelDataset and MockGPTDataset (megatron-core's gpt_dataset.py) over dlm's GPTDataset index.
#include "dlm/data/mock_dataset.h"

#include <algorithm>

#include "dlm/common/error.h"
#include "dlm/data/blend.h"
#include "dlm/data/numpy_generator.h"

namespace dlm::data {
namespace {

// MockGPTLowLevelDataset's class constants.
constexpr std::uint64_t kMockSeed = 0;
constexpr std::size_t kMockDocuments = 100000;
constexpr std::int32_t kMockMaxSequenceLength = 4096;

}  // namespace

std::span<const std::int32_t> mock_sequence_lengths() {
  static const std::vector<std::int32_t> lengths =
      NumpyPcg64(kMockSeed).integers_int32(1, kMockMaxSequenceLength, kMockDocuments);
  return lengths;
}

MockGptDataset::MockGptDataset(std::int64_t begin, std::int64_t end, std::optional<std::int64_t> num_samples,
                               const GptIndexConfig& config, MockTokens tokens)
    : index_(build_gpt_index(mock_sequence_lengths(), begin, end, num_samples, true, config)),
      tokens_(tokens),
      extra_(config.add_extra_token_to_sequence ? 1 : 0) {
  if (tokens_.vocab_size <= 0) fail("--mock-data: the tokenizer's vocabulary is empty");
}

void MockGptDataset::raw_tokens(std::size_t i, std::vector<std::int32_t>& out) const {
  if (i >= size()) fail("mock sample " + std::to_string(i) + " is past the split's " + std::to_string(size()) + " samples");
  const auto lengths = mock_sequence_lengths();
  const auto row = static_cast<std::size_t>(index_.shuffle_index[i]);
  const auto& si = index_.sample_index;
  const std::int64_t first_doc = si[2 * row], first_offset = si[2 * row + 1];
  const std::int64_t last_doc = si[2 * row + 2], last_offset = si[2 * row + 3];
  out.clear();
  for (std::int64_t p = first_doc; p <= last_doc; ++p) {
    const auto doc = static_cast<std::size_t>(index_.document_index[static_cast<std::size_t>(p)]);
    const std::int64_t length = lengths[doc];
    const std::int64_t from = p == first_doc ? first_offset : 0;
    // The last piece ends at the next sample's start plus the shared extra token (a slice: clamped to the document).
    const std::int64_t to = p == last_doc ? std::min(length, last_offset + extra_) : length;
    for (std::int64_t k = from; k < to; ++k)
      out.push_back(k == length - 1 ? tokens_.eod : static_cast<std::int32_t>((k + 1) % tokens_.vocab_size));
  }
}

std::array<std::optional<MockGptDataset>, 3> build_mock_datasets(const std::array<std::optional<std::int64_t>, 3>& sizes,
                                                                 const GptIndexConfig& config, MockTokens tokens) {
  GptIndexConfig c = config;
  c.write_cache = false;
  const SplitMatrix matrix = split_matrix(parse_split("1,1,1"));
  std::array<std::optional<MockGptDataset>, 3> out;
  for (std::size_t s = 0; s < 3; ++s) {
    if (!matrix[s]) continue;
    const auto [begin, end] = split_range(*matrix[s], kMockDocuments);
    out[s].emplace(begin, end, sizes[s], c, tokens);
  }
  return out;
}

}  // namespace dlm::data
