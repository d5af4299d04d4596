// BlendedDataset and BlendedMegatronDatasetBuilder, as megatron-core builds them.
//
//   --data-path "w1 p1 w2 p2"  weights are normalized to sum 1 (numpy's float64 sum); each dataset
//                 is asked for ceil(ceil(size * w) * (1 + surplus)) samples (surplus 0.005), and
//                 the blend for sum over datasets of ceil(size * w)
//   blending      for sample s, x = max(s, 1): the dataset d with the largest w[d] * x - taken[d]
//                 (the first on a tie); dataset_index[s] = d, dataset_sample_index[s] = taken[d]++
//   exhaustive    with no weights and no size: every sample of every dataset once, by the same
//                 rule over the datasets not yet spent, weights = sizes / total
//   --split "969,30,1"  the numbers are normalized; split i covers sequences
//                 [round(c[i] * N), round(c[i+1] * N)) of each dataset, c the running sums
//                 (Python's round: ties to even); a zero part leaves its split unbuilt
//   blend per split  train/valid/test each from their own list; a list of one prefix is a
//                 GPTDataset alone (its weight ignored)
// Cached as `{md5}-BlendedDataset-{split}-dataset_index.npy` / `-dataset_sample_index.npy` beside a
// description file, under the cache path only (as Megatron), with dlm's checksums beside them; a
// cache is reused only when its arrays keep their invariants and checksums (index_cache.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dlm/data/gpt_dataset.h"
#include "dlm/data/npy.h"

namespace dlm::data {

// A list of dataset prefixes, with weights or without (then each weighs its size).
struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;
};

// Megatron's get_blend_from_list over the words of --data-path (each argument is also split on
// whitespace): "w1 p1 w2 p2 ..." or "p1 p2 ...". Throws dlm::Error on a weight that is not a
// finite number > 0, on a mix of weighted and unweighted entries, or on an empty list.
Blend parse_blend(std::span<const std::string> arguments, const std::string& flag = "--data-path");
// parse_and_normalize_split: the numbers of `split`, zero-padded to 3, normalized. Throws on more
// than 3 parts, a malformed number, or parts summing to 0.
std::array<double, 3> parse_split(const std::string& split);
SplitMatrix split_matrix(const std::array<double, 3>& normalized);
// numpy's w / w.sum() (pairwise float64 summation).
std::vector<double> normalize_weights(std::span<const double> weights);
// The [begin, end) sequence range of a split over n sequences.
std::pair<std::int64_t, std::int64_t> split_range(const std::pair<double, double>& bookends, std::size_t n);

struct BlendingIndices {
  NpyArray dataset_index;         // int16 [size]
  NpyArray dataset_sample_index;  // int64 [size]
};
BlendingIndices build_blending_indices(std::span<const double> weights, std::int64_t size);
BlendingIndices build_exhaustive_blending_indices(std::span<const std::int64_t> sizes);

struct BuilderConfig {
  GptIndexConfig gpt;                              // seed, sequence length, cache, tokenizer...
  std::optional<Blend> blend;                      // with split
  std::optional<std::string> split;                // "969,30,1"
  std::array<std::optional<Blend>, 3> blend_per_split;  // or this, without split
  std::array<std::optional<std::int64_t>, 3> sizes;     // samples wanted per split (none: one epoch)
  double mid_level_dataset_surplus = 0.005;
};

// One split of the result: a GPTDataset alone, or a BlendedDataset over several.
struct SplitDataset {
  Split split = Split::kTrain;
  std::vector<std::shared_ptr<const GptDataset>> datasets;
  bool blended = false;
  // Blended only: the weights the blend used (normalized, or the datasets' sizes for an
  // exhaustive blend), its size, its description, and its indices.
  std::vector<double> weights;
  bool integer_weights = false;
  std::optional<std::int64_t> blend_size;
  std::string description, description_hash;
  bool loaded_from_cache = false;
  BlendingIndices indices;

  std::size_t size() const;  // samples
  // Dataset and sample within it for global sample i.
  std::pair<std::size_t, std::size_t> locate(std::size_t i) const;
};

// BlendedMegatronDatasetBuilder(GPTDataset, sizes, config).build(): every split, built or loaded
// from the cache. Every index is planned first: a build whose indices cannot fit the free space of
// their cache's filesystem (or, writing no cache, the available memory) is refused before anything
// is written. Throws dlm::Error (one line, naming the file or flag, and the sizes) on bad input.
std::array<std::optional<SplitDataset>, 3> build_datasets(const BuilderConfig& config);

}  // namespace dlm::data
