// SampleReader: a split's samples as the trainer consumes them, as GPTDataset.__getitem__ makes them.
//
// Sample i of a split: the blend (if any) names a dataset and a sample in it; the dataset's shuffle
// index names a row of its sample index, which gives seq_length + extra tokens read straight from the
// mapped .bin, possibly across documents (padded with pad_id at the very end of the data).
//   tokens   = text[:-1], labels = text[1:]   (add_extra_token_to_sequence, the default)
//   tokens   = text,      labels = text shifted left, last = pad   (without the extra token)
//   loss_mask  1; 0 where tokens == eod (eod_mask_loss) and where labels == pad
//   position_ids  0, 1, ...; restarting after each eod in tokens (reset_position_ids)
//   segment_ids   the number of eods before each position (reset_attention_mask): position q
//                 attends to k iff k <= q and segment_ids[k] == segment_ids[q], which is exactly
//                 Megatron's per-document causal mask without its [S, S] matrix
// Pad ids in tokens and labels become 0 (Megatron's embedding-safe value). Reads are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dlm/data/blend.h"

namespace dlm::data {

struct SampleOptions {
  std::int32_t eod = -1;           // the tokenizer's eod id
  std::int32_t pad = -1;           // the tokenizer's pad id, or -1 (Megatron's default)
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
};

struct Sample {
  std::vector<std::int32_t> tokens, labels;  // seq_length each
  std::vector<float> loss_mask;
  std::vector<std::int32_t> position_ids;
  std::vector<std::int32_t> segment_ids;     // all 0 unless reset_attention_mask
  std::size_t dataset = 0;                   // which dataset of the blend
  std::size_t dataset_sample = 0;            // sample id within that dataset (before its shuffle)
};

// A piece of a sample's raw tokens: bytes of one sequence of `dataset`'s mapped .bin.
struct SamplePiece {
  const IndexedDataset* dataset = nullptr;
  std::int64_t sequence = 0;  // sequence id in the IndexedDataset
  std::span<const std::uint8_t> bytes;
};

class SampleReader {
 public:
  // `split` must outlive the reader.
  SampleReader(const SplitDataset& split, SampleOptions options);

  std::size_t size() const noexcept { return split_.size(); }
  std::int32_t sequence_length() const noexcept { return seq_length_; }

  // The raw seq_length + extra tokens of sample i, zero-copy: spans into the mapped .bin files
  // (their dtype is dataset->dtype()). Fewer tokens than that only at the data's very end.
  std::vector<SamplePiece> pieces(std::size_t i) const;
  // The raw tokens widened to int32, padded with options.pad to seq_length + extra.
  void raw_tokens(std::size_t i, std::vector<std::int32_t>& out) const;
  // The full sample; `out`'s vectors are reused.
  void read(std::size_t i, Sample& out) const;
  Sample read(std::size_t i) const {
    Sample s;
    read(i, s);
    return s;
  }

 private:
  const SplitDataset& split_;
  SampleOptions options_;
  std::int32_t seq_length_;
  std::int32_t extra_;
};

}  // namespace dlm::data
