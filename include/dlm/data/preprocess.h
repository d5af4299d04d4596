// Preprocessing: JSONL text -> Megatron .bin/.idx, byte-identical to Megatron-LM's
// tools/preprocess_data.py with the same tokenizer and flags.
//
// Megatron's rules, kept exactly:
//   - one JSON object per line; documents are written in input order (files in --input order), one
//     document per line and per json key, to "{prefix}_{key}_document" ("_sentence" with
//     --split-sentences);
//   - a key's value is a string (one sequence) or an array of strings (one sequence per string, the
//     layout Megatron's sentence splitter writes); sequences that tokenize to nothing are dropped;
//   - --append-eod adds the eod id to the last sequence of a document that has any token;
//   - a document with no token at all is still a document (zero sequences);
//   - token dtype: uint16 when the vocabulary has fewer than 65500 ids, else int32;
//   - --partitions P (without --keep-sequential-samples) deals lines round-robin to P partitions and
//     concatenates the partitions, so line i lands in partition i % P.
//
// The pipeline: one reader (blocks of whole lines), N tokenizer workers, one writer that takes blocks
// back in input order. At most 2N+2 blocks are in flight, so memory does not grow with the input
// (besides the .idx arrays, 12 bytes per document, which Megatron keeps in memory too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlm/data/tokenizer.h"

namespace dlm::data {

// Each partition keeps its own temporary .bin per key open until the partitions are concatenated.
inline constexpr std::size_t kMaxPartitions = 256;

struct PreprocessOptions {
  std::vector<std::string> inputs;             // --input: files, globs, folders, "-"
  std::string output_prefix;                   // --output-prefix
  std::vector<std::string> json_keys{"text"};  // --json-keys
  bool append_eod = false;                     // --append-eod
  // --split-sentences: sentence-level outputs. dlm does not split text itself (NLTK punkt is a trained
  // model it does not reproduce): every value must already be an array of sentences.
  bool split_sentences = false;
  std::size_t workers = 1;                     // --workers, 1 to kMaxThreads
  std::size_t partitions = 1;                  // --partitions, 1 to kMaxPartitions
  bool keep_sequential_samples = false;        // --keep-sequential-samples
  std::uint64_t log_interval = 1000;           // --log-interval: documents between progress lines
  bool skip_invalid = false;                   // --skip-invalid: skip and count bad lines
  bool progress = true;                        // progress lines on stderr
  std::size_t block_bytes = 1 << 20;           // bytes of input per block handed to a worker
};

struct PreprocessOutput {
  std::string key;
  std::string prefix;  // {output_prefix}_{key}_{document|sentence}
  std::uint64_t documents = 0, sequences = 0, tokens = 0;
};

struct PreprocessSummary {
  std::vector<PreprocessOutput> outputs;
  std::uint64_t documents = 0;        // lines turned into documents
  std::uint64_t skipped_lines = 0;    // bad lines skipped by --skip-invalid
  std::vector<std::string> first_skipped;  // "FILE:LINE: message" of the first few
  std::uint64_t bytes_in = 0;         // text bytes read (after decompression)
  std::uint64_t bytes_out = 0;        // .bin + .idx bytes written
  double seconds = 0;
};

// "{prefix}_{key}_document" or "{prefix}_{key}_sentence", as Megatron names its outputs.
std::string output_name(const std::string& prefix, const std::string& key, bool sentence_level);

// Megatron's Encoder.encode for one key of one document: tokenizes each sentence, drops empty ones,
// appends eod to the last when asked. Appends to `tokens` and `lengths` (one length per sequence kept).
void encode_document(const Tokenizer& tokenizer, std::span<const std::string_view> sentences, bool append_eod,
                     std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& lengths);

// Runs the whole job. Throws dlm::Error ("FILE:LINE: what was expected" for bad input) after removing
// every output it had started; on success every output is complete (written atomically).
PreprocessSummary preprocess_jsonl(const PreprocessOptions& options, const Tokenizer& tokenizer);

// The summary as the lines dlm-preprocess prints at the end.
std::string format_summary(const PreprocessSummary& summary);

}  // namespace dlm::data
