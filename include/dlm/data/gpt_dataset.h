// GPTDataset's index, as megatron-core builds it: the same arrays, bit for bit, for the same inputs.
//
// A GPTDataset exposes a contiguous range of an IndexedDataset's sequences (its split) as samples of
// sequence_length tokens (+1 with add_extra_token_to_sequence), packed across documents:
//   epochs          the least E >= 1 with E * tokens_per_epoch >= num_samples * L + extra
//   document index  the split's sequence ids tiled E times and shuffled by numpy's
//                   RandomState(seed); when E > 1 and the last epoch contributes fewer than
//                   int(0.8 * samples_per_epoch) samples, the first E-1 epochs and the last one
//                   are shuffled apart and concatenated ("separate final epoch")
//   sample index    [samples + 1, 2]: (position in the document index, token offset) where each
//                   sample starts; consecutive samples share the extra token
//   shuffle index   a permutation of the samples by the same RandomState (two ranges shuffled
//                   apart with a separate final epoch); uint32 unless the count needs int64
// The arrays are cached as `{md5(description)}-GPTDataset-{split}-*.npy` beside a description file,
// so dlm and megatron-core reuse each other's caches; dlm adds `checksums.dlm` beside its own, and
// reuses a cache only when the arrays keep their invariants (and checksums, where written).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "dlm/data/indexed_dataset.h"
#include "dlm/data/npy.h"

namespace dlm::data {

enum class Split : std::uint8_t { kTrain = 0, kValid = 1, kTest = 2 };
const char* split_name(Split split);  // "train", "valid", "test"

// Per split, the [begin, end) fractions of the data, or none when the split is empty.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;

// The GPTDatasetConfig attributes that shape the index or name its cache.
struct GptIndexConfig {
  std::uint32_t random_seed = 1234;
  std::int32_t sequence_length = 0;
  bool add_extra_token_to_sequence = true;
  bool drop_last_partial_validation_sequence = true;
  // Only for the description (hence the cache names): the split string and its matrix as the
  // config holds them (none with blend_per_split), and the tokenizer's unique identifiers as JSON
  // (copy them from a Megatron description file; NullTokenizer's by default).
  std::optional<std::string> split;
  std::optional<SplitMatrix> split_matrix;
  std::string tokenizer_identifiers =
      R"({"class": "megatron.core.tokenizers.text.libraries.null_tokenizer.NullTokenizer"})";
  // Where caches live; none: Megatron's default, "{prefix}/cache/GPTDataset_indices".
  std::optional<std::string> cache_path;
  bool write_cache = true;
};

// The shape of one index, from the sequence lengths alone (gpt_dataset.py's
// _get_num_tokens_per_epoch, _get_num_epochs and the separate-final-epoch rule; helpers.cpp's
// sample count): what the builder checks the disk against, the build follows and a cached index
// must have. A split holding fewer tokens than one sample is repeated over as many epochs as the
// demand needs, as megatron-core does.
struct GptIndexPlan {
  std::int64_t tokens = 0;                // per epoch
  std::int64_t epochs = 1;
  std::int64_t samples = 0;
  std::int64_t samples_before_final = 0;  // with a separate final epoch: the first E-1 epochs' samples
  bool separate_final_epoch = false;
  std::uint64_t documents = 0;            // document index entries: epochs * sequences
  bool sample_index_int64 = false;        // more than 2^31-1 document index entries
  bool shuffle_index_int64 = false;       // samples >= 2^32 - 2
  std::uint64_t bytes() const;            // the three .npy files
};

struct GptIndex {
  NpyArray document_index;  // int32 [epochs * documents]
  NpyArray sample_index;    // int32 or int64 [samples + 1, 2]
  NpyArray shuffle_index;   // uint32 or int64 [samples]
  std::int64_t num_epochs = 0;
  std::int64_t tokens_per_epoch = 0;
  bool separate_final_epoch = false;
  std::size_t num_samples() const { return sample_index.shape()[0] - 1; }
};

// The three arrays for sequences [begin, end) of `sequence_lengths` (no files touched).
// num_samples: none builds one epoch. drop_last_partial: false keeps a last, padded sample.
GptIndex build_gpt_index(std::span<const std::int32_t> sequence_lengths, std::int64_t begin, std::int64_t end,
                         std::optional<std::int64_t> num_samples, bool drop_last_partial,
                         const GptIndexConfig& config);

// Megatron's GPTDataset: its index loaded from the cache when valid, else built (and cached).
class GptDataset {
 public:
  GptDataset(std::shared_ptr<const IndexedDataset> dataset, std::string prefix, std::int64_t begin,
             std::int64_t end, std::optional<std::int64_t> num_samples, Split split, const GptIndexConfig& config);

  std::size_t size() const { return index_.num_samples(); }
  const GptIndex& index() const noexcept { return index_; }
  const IndexedDataset& dataset() const noexcept { return *dataset_; }
  const std::string& prefix() const noexcept { return prefix_; }
  Split split() const noexcept { return split_; }
  std::int64_t begin() const noexcept { return begin_; }
  std::int64_t end() const noexcept { return end_; }
  std::optional<std::int64_t> num_samples_requested() const noexcept { return num_samples_; }
  const GptIndexConfig& config() const noexcept { return config_; }
  // json.dumps(unique_identifiers, indent=4) and its md5.
  const std::string& description() const noexcept { return description_; }
  const std::string& description_hash() const noexcept { return hash_; }
  // "{cache}/{hash}-GPTDataset-{split}-" (empty when not cached).
  const std::string& cache_base() const noexcept { return cache_base_; }
  bool loaded_from_cache() const noexcept { return from_cache_; }
  const GptIndexPlan& plan() const noexcept { return plan_; }

  // Where sample i (before the shuffle: shuffle_index[i] is applied here) starts and ends:
  // (document index position, offset) of its first and of its last token's successor.
  struct Span { std::int64_t first_doc, first_offset, last_doc, last_offset; };
  Span sample_span(std::size_t i) const;

 private:
  bool try_load_cache();
  std::shared_ptr<const IndexedDataset> dataset_;
  std::string prefix_;
  std::int64_t begin_, end_;
  std::optional<std::int64_t> num_samples_;
  Split split_;
  GptIndexConfig config_;
  std::string description_, hash_, cache_base_;
  bool from_cache_ = false;
  GptIndexPlan plan_;
  GptIndex index_;
};

}  // namespace dlm::data
