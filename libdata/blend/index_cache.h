// What a cached index must satisfy to be reused: the invariants of GPTDataset's and BlendedDataset's
// arrays, and the checksums dlm stores beside the arrays it writes.
//
//   {base}checksums.dlm   one line per array, "{name}.npy {16 hex digits}" (checksum64 of its data
//                         bytes), written atomically after the arrays and before the description
//                         that marks the set complete. megatron-core neither writes nor reads it; a
//                         cache without it (megatron-core's) is checked by its invariants alone.
// A cache breaking either is rebuilt with a warning (or refused where rebuilding is off), never read.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "dlm/common/unaligned_array.h"
#include "dlm/data/blend.h"
#include "dlm/data/gpt_dataset.h"

namespace dlm::data::detail {

// A 64-bit checksum of bytes (four multiply-rotate lanes over 8-byte words, then the tail): not
// cryptographic; any flipped byte, truncation or reordering of words changes it.
std::uint64_t checksum64(const std::uint8_t* data, std::size_t size);

using NamedArray = std::pair<const char*, const NpyArray*>;  // ("sample_index", &array)
void write_checksums(const std::string& base, std::span<const NamedArray> arrays);
// The first array whose checksum differs from {base}checksums.dlm, as (file name, what is wrong);
// none when they all match or there is no such file.
std::optional<std::pair<std::string, std::string>> checksum_defect(const std::string& base,
                                                                   std::span<const NamedArray> arrays);

// The first broken invariant of a GPTDataset index for sequences [begin, end) planned as `plan`:
//   document index  int32[plan.documents]; every sequence of the split appears plan.epochs times
//   sample index    the plan's dtype, [samples + 1, 2]; row 0 is (0, 0); every row points into the
//                   document index at an offset within its document; consecutive rows are exactly
//                   sequence_length tokens apart (the last row of a kept partial sample: at most)
//   shuffle index   the plan's dtype; a permutation of [0, first) then of [first, samples)
// Returns (file name, what is wrong), or none.
std::optional<std::pair<std::string, std::string>> gpt_index_defect(const GptIndex& index, const GptIndexPlan& plan,
                                                                     UnalignedArray<std::int32_t> lengths,
                                                                     std::int64_t begin, std::int64_t end,
                                                                     const GptIndexConfig& config, bool drop_last);

// The first broken invariant of a BlendedDataset's indices of `size` samples over datasets of
// `dataset_sizes` samples: dataset_index int16 in [0, D); dataset_sample_index int64 counting each
// dataset's samples 0, 1, 2... in order, never past its size.
std::optional<std::pair<std::string, std::string>> blending_defect(const BlendingIndices& indices, std::size_t size,
                                                                   std::span<const std::size_t> dataset_sizes);

}  // namespace dlm::data::detail
