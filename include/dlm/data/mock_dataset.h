// megatron-core's mock data (--mock-data): MockGPTLowLevelDataset under a GPTDataset per split, the same
// samples, token for token, for the same seed and sizes.
//
//   documents   100000, document d of length L[d], L = default_rng(0).integers(1, 4096, 100000, int32)
//               (seed 0 whatever the run's seed: numpy_generator.h)
//   tokens      document d is (1, 2, ..., L[d] - 1) mod vocab_size, then eod: the tokenizer's vocab_size and
//               eod (NullTokenizer --vocab-size V: V + 1 and V)
//   splits      always "1,1,1" (BlendedMegatronDatasetConfig sets it for mock data): documents [0, 33333),
//               [33333, 66667), [66667, 100000); each a GPTDataset index (gpt_dataset.h) of its split's samples
//               (megatron_split_sizes) with the run's seed, built in memory
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dlm/data/gpt_dataset.h"

namespace dlm::data {

// MockGPTLowLevelDataset's document lengths (computed once).
std::span<const std::int32_t> mock_sequence_lengths();

struct MockTokens {
  std::int64_t vocab_size = 0;  // the tokenizer's vocab_size
  std::int32_t eod = 0;
};

class MockGptDataset {
 public:
  MockGptDataset(std::int64_t begin, std::int64_t end, std::optional<std::int64_t> num_samples,
                 const GptIndexConfig& config, MockTokens tokens);
  std::size_t size() const { return index_.num_samples(); }
  // The seq_length + 1 tokens of sample i (GPTDataset.__getitem__'s text before tokens/labels).
  void raw_tokens(std::size_t i, std::vector<std::int32_t>& out) const;
  const GptIndex& index() const noexcept { return index_; }

 private:
  GptIndex index_;
  MockTokens tokens_;
  std::int32_t extra_;
};

// BlendedMegatronDatasetBuilder(MockGPTDataset, sizes, config).build(): the three splits ("1,1,1" leaves none
// empty), each of its size in samples.
std::array<std::optional<MockGptDataset>, 3> build_mock_datasets(const std::array<std::optional<std::int64_t>, 3>& sizes,
                                                                 const GptIndexConfig& config, MockTokens tokens);

}  // namespace dlm::data
