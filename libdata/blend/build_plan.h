// What BlendedMegatronDatasetBuilder.build() will make, decided before anything is built: which
// GPTDatasets each split is made of and how many samples each is asked for, whether the split is
// blended and to what size; then the bytes that takes on each filesystem (or in memory), checked
// against what is free so that a build that cannot fit is refused before its first byte.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlm/data/blend.h"

namespace dlm::data::detail {

using Sizes = std::array<std::optional<std::int64_t>, 3>;

// One call of _build_megatron_datasets_parallel and the BlendedDatasets over its result: with
// --data-path one group serves the three splits; with per-split paths each split has its own.
struct BlendGroup {
  std::vector<std::string> prefixes;
  SplitMatrix matrix;            // the splits this group builds
  GptIndexConfig gpt;            // with the split string and matrix the descriptions name
  std::vector<Sizes> buffers;    // per prefix: samples asked of each split (none: one epoch)
  bool single = false;           // one prefix without weights: each split is its GPTDataset alone
  std::optional<std::vector<double>> weights;  // normalized, as the builder normalizes them
  Sizes targets;                 // weighted: the blended size, sum over prefixes of ceil(size * w)
  Sizes requested;               // the sample counts asked of each split
};

// The groups of `config` (megatron-core's case analysis). Throws dlm::Error on a config megatron-
// core refuses (no data, --split with per-split paths, weights without a sample count).
std::vector<BlendGroup> blend_layout(const BuilderConfig& config);

// BlendedDataset's size for split i of a group, given its members' sample counts: the targets'
// sum when weighted, else min(requested, available), else (no size) every sample.
std::int64_t blended_size(const BlendGroup& group, std::size_t split, const std::vector<std::int64_t>& member_samples);

// Bytes a build will write under `folder` (none: held in memory), and what they are for.
struct SpaceNeed {
  std::optional<std::string> folder;
  std::uint64_t bytes = 0;
  std::string what;  // "train: 100000000000 blended samples"
};
// Throws dlm::Error, one line naming the folder, the bytes needed (and for what) and the bytes free,
// when the needs of one filesystem exceed its free space (statvfs), or the in-memory needs exceed
// MemAvailable.
void check_space(const std::vector<SpaceNeed>& needs);

}  // namespace dlm::data::detail
