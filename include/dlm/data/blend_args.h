// Megatron-LM's data flags, turned into a BuilderConfig, and the report `dlm-blend inspect` prints.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlm/data/blend.h"

namespace dlm::data {

struct MegatronDataArgs {
  std::vector<std::string> data_path;                       // --data-path
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split = "969, 30, 1";                         // --split (Megatron-LM's default)
  std::int32_t seq_length = 0;                              // --seq-length
  std::optional<std::int64_t> train_samples, train_iters;   // one of them
  std::int64_t global_batch_size = 0;
  std::int64_t eval_iters = 100, eval_interval = 1000;
  bool full_validation = false;                             // --full-validation: the validation split one epoch
  std::uint32_t seed = 1234;
  std::optional<std::string> data_cache_path;
  bool add_extra_token_to_sequence = true;
  std::string tokenizer_identifiers;                        // empty: NullTokenizer's
};

// Megatron-LM's sample counts: train = train_samples or train_iters * gbs (train_iters =
// train_samples / gbs when samples are given); valid = (train_iters / eval_interval + 1) *
// eval_iters * gbs; test = eval_iters * gbs. Throws dlm::Error naming the flag that is wrong.
std::array<std::int64_t, 3> megatron_split_sizes(const MegatronDataArgs& args);
// The sample counts the builder is asked for: megatron_split_sizes, but none for the validation split with
// full_validation (one epoch of it: Megatron's get_train_valid_test_num_samples gives None there).
std::array<std::optional<std::int64_t>, 3> megatron_split_request(const MegatronDataArgs& args);
BuilderConfig builder_config(const MegatronDataArgs& args);

// Per split: datasets with their sequence ranges, requested vs effective weights, epochs, samples,
// cache files and whether they were reused.
std::string inspect_report(const std::array<std::optional<SplitDataset>, 3>& splits);

}  // namespace dlm::data
