// Megatron's indexed dataset: token sequences in a `.bin` file described by an `.idx` file.
//
// Byte-compatible with megatron-core's IndexedDataset / IndexedDatasetBuilder:
//   .idx = "MMIDIDX\0\0" | u64 version=1 | u8 dtype code | u64 sequence count | u64 document count |
//          i32 lengths[sequences] | i64 byte pointers[sequences] | i64 document indices[documents]
//   .bin = every sequence's tokens back to back, little-endian, in the dtype.
// A document is a run of sequences (sentences, or one sequence); document_indices starts with 0 and
// after each document holds the count of sequences written so far.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dlm/common/atomic_file.h"
#include "dlm/common/mapped_file.h"
#include "dlm/common/unaligned_array.h"

namespace dlm::data {

enum class DType : std::uint8_t {
  kUInt8 = 1, kInt8 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5, kFloat64 = 6, kFloat32 = 7, kUInt16 = 8,
};

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Throws dlm::Error when `code` is not one of Megatron's dtype codes.
DType dtype_from_code(std::uint8_t code);
// Megatron's choice for token files: uint16 when the vocabulary has fewer than 65500 ids, else int32.
DType optimal_token_dtype(std::optional<std::size_t> vocab_size);

std::string idx_path(const std::string& prefix);  // prefix + ".idx"
std::string bin_path(const std::string& prefix);  // prefix + ".bin"

// Writes a dataset; nothing appears under the final names until finalize().
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, DType dtype);

  // One sequence (a sentence, or a whole document). Ids must fit the dtype.
  void add_item(std::span<const std::int32_t> tokens);
  // Closes the current document.
  void end_document();
  // A whole document given as its tokens and the lengths of its sequences.
  void add_document(std::span<const std::int32_t> tokens, std::span<const std::int32_t> lengths);
  // Appends another dataset (Megatron's add_index / merge_datasets.py); its dtype must match and it must
  // pass validate().
  void append(const std::string& other_prefix);
  // Writes the .idx, fsyncs and renames both files into place: the old .idx is removed first, then the .bin
  // and the .idx are renamed, so that a kill leaves the old pair, no .idx, or the new pair.
  void finalize();

  DType dtype() const noexcept { return dtype_; }
  std::size_t num_sequences() const noexcept { return lengths_.size(); }
  std::size_t num_documents() const noexcept { return document_indices_.size() - 1; }
  std::uint64_t num_tokens() const noexcept { return tokens_; }

 private:
  std::string prefix_;
  DType dtype_;
  AtomicFile bin_;
  std::vector<std::int32_t> lengths_;
  std::vector<std::int64_t> document_indices_{0};
  std::vector<std::uint8_t> scratch_;
  std::uint64_t tokens_ = 0;
  bool finalized_ = false;
};

// A read-only, zero-copy view of a dataset (both files memory-mapped).
// Opening checks the whole structure, so that every reader can trust it: the header, the counts against
// the file sizes, every length >= 0, every pointer the running sum of the lengths before it, the .bin
// exactly as long as the index describes (a stale pair or trailing bytes are refused), document indices
// monotone from 0 within the sequence count, and no trailing .idx bytes (but Megatron's one mode byte per
// sequence). validate() also reads every token: none negative, float tokens whole int32 values.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);

  DType dtype() const noexcept { return dtype_; }
  std::size_t num_sequences() const noexcept { return lengths_.size(); }
  // Documents, not counting the leading 0 of document_indices.
  std::size_t num_documents() const noexcept { return documents_.size() - 1; }
  // Views into the mapped .idx (its arrays are not aligned for their types, hence UnalignedArray).
  const UnalignedArray<std::int32_t>& sequence_lengths() const noexcept { return lengths_; }
  const UnalignedArray<std::int64_t>& sequence_pointers() const noexcept { return pointers_; }
  const UnalignedArray<std::int64_t>& document_indices() const noexcept { return documents_; }
  const std::string& prefix() const noexcept { return prefix_; }

  // Raw bytes of sequence i from token `offset`, `length` tokens (npos: to the end). Zero-copy.
  std::span<const std::uint8_t> sequence_bytes(std::size_t i, std::size_t offset = 0,
                                               std::size_t length = npos) const;
  // The whole mapped .bin.
  std::span<const std::uint8_t> bin_bytes() const noexcept { return bin_.bytes(); }
  // The same tokens widened to int32 (appended to `out`).
  void read_sequence(std::size_t i, std::vector<std::int32_t>& out, std::size_t offset = 0,
                     std::size_t length = npos) const;
  std::vector<std::int32_t> sequence(std::size_t i, std::size_t offset = 0, std::size_t length = npos) const;
  // All tokens of document d (its sequences concatenated).
  std::vector<std::int32_t> document(std::size_t d) const;
  // The structural check of opening, then every token; throws dlm::Error naming the file and offset of
  // the first problem.
  void validate() const;

  static constexpr std::size_t npos = ~std::size_t{0};

 private:
  void check_structure() const;
  std::string prefix_;
  MappedFile idx_, bin_;
  DType dtype_{};
  UnalignedArray<std::int32_t> lengths_;
  UnalignedArray<std::int64_t> pointers_;
  UnalignedArray<std::int64_t> documents_;
};

// The smallest and largest token id of a dataset's .bin (a pass over every token); min_offset is the byte
// offset of the smallest. Float tokens that are not whole int32 values throw dlm::Error.
struct TokenRange {
  std::int64_t min = 0, max = -1;
  std::uint64_t min_offset = 0;
};
TokenRange token_range(const IndexedDataset& dataset);

// Widens `count` tokens of `dtype` at `src` to int32 into `dst`; a negative id, or a value no int32 id
// has, throws dlm::Error.
void widen_tokens(DType dtype, const std::uint8_t* src, std::size_t count, std::int32_t* dst);

}  // namespace dlm::data
