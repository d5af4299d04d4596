// A driver for interop_mock.py: dlm's --mock-data samples as JSON.
//   mock_tool SEED SEQ_LENGTH VOCAB_SIZE EOD TRAIN VALID TEST
//   -> {"lengths": [...the 100000 document lengths...], "sizes": [samples per split],
//       "splits": [[[raw tokens of sample i] for the first 64 and the last 8 samples of the split], ...]}
// (a split holds every sample of its epochs, far more than the requested size: megatron-core's len() too)
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dlm/data/mock_dataset.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: mock_tool SEED SEQ_LENGTH VOCAB_SIZE EOD TRAIN VALID TEST\n");
    return 2;
  }
  dlm::data::GptIndexConfig config;
  config.random_seed = static_cast<std::uint32_t>(std::stoul(argv[1]));
  config.sequence_length = std::stoi(argv[2]);
  const dlm::data::MockTokens tokens{std::stoll(argv[3]), std::stoi(argv[4])};
  const std::array<std::optional<std::int64_t>, 3> sizes = {std::stoll(argv[5]), std::stoll(argv[6]), std::stoll(argv[7])};
  const auto splits = dlm::data::build_mock_datasets(sizes, config, tokens);
  fmt::print("{{\"lengths\": [{}], \"sizes\": [", fmt::join(dlm::data::mock_sequence_lengths(), ", "));
  for (std::size_t s = 0; s < splits.size(); ++s) fmt::print("{}{}", s ? ", " : "", splits[s] ? splits[s]->size() : 0);
  fmt::print("], \"splits\": [");
  std::vector<std::int32_t> raw;
  for (std::size_t s = 0; s < splits.size(); ++s) {
    fmt::print("{}[", s ? ", " : "");
    const std::size_t n = splits[s] ? splits[s]->size() : 0;
    bool first = true;
    for (std::size_t i = 0; i < n; ++i) {
      if (i == 64 && n > 72) i = n - 8;
      splits[s]->raw_tokens(i, raw);
      fmt::print("{}[{}]", first ? "" : ", ", fmt::join(raw, ", "));
      first = false;
    }
    fmt::print("]");
  }
  fmt::print("]}}\n");
  return 0;
}
