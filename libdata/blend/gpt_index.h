// GPTDataset's index built straight into its cache files (see npy_output.h), and the plan of its
// sizes, computed once for the builder's disk check, the build and the cache check.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dlm/common/unaligned_array.h"
#include "dlm/data/gpt_dataset.h"

namespace dlm::data::detail {

// Where a GPTDataset's cache lives: the cache path, or Megatron's default
// "{prefix}/cache/GPTDataset_indices"; and its files' common beginning "{folder}/{hash}-GPTDataset-{split}-".
std::string gpt_cache_folder(const std::string& prefix, const GptIndexConfig& config);
std::string gpt_cache_base(const std::string& folder, const std::string& hash, Split split);

// GptIndexPlan for sequences [begin, end). Throws dlm::Error (no file named; the caller adds it) where megatron-core cannot build: an empty
// range or one without tokens but with a sample demand (megatron-core loops forever on it), or a
// demand needing more epochs than its helpers take (int32).
// `what` names the split in the message ("the train split").
GptIndexPlan plan_gpt_index(UnalignedArray<std::int32_t> lengths, std::int64_t begin, std::int64_t end,
                            std::optional<std::int64_t> num_samples, bool drop_last_partial,
                            const GptIndexConfig& config, const std::string& what);

// build_gpt_index over lengths read in place (e.g. from the mapped .idx). cache_base
// "{cache}/{hash}-GPTDataset-{split}-": each array is written to cache_base + "{name}.npy" as it is
// built; empty: the arrays stay in memory.
GptIndex build_gpt_index_into(UnalignedArray<std::int32_t> lengths, const GptIndexPlan& plan, std::int64_t begin,
                              std::int64_t end, const GptIndexConfig& config, const std::string& cache_base);

}  // namespace dlm::data::detail
