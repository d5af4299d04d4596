// Internal to the preprocessing pipeline: a block of lines and what the workers made of it.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "dlm/data/jsonl.h"
#include "dlm/data/preprocess.h"

namespace dlm::data::preprocess_detail {

// The documents of one json key, back to back.
struct KeyTokens {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> lengths;           // per sequence
  std::vector<std::uint32_t> sequence_counts;  // per document
};

struct EncodedBlock {
  std::uint64_t index = 0;                 // position in the input, the writer's order
  LineBlock lines;
  std::vector<KeyTokens> keys;             // one per json key
  std::vector<std::uint32_t> document_lines;  // line of each document, counted from the block's first
  std::uint64_t line_count = 0;
  std::uint64_t skipped = 0;
  std::vector<std::string> skipped_examples;
  std::exception_ptr error;                // the first bad line (or a read error); stops the run
};

struct EncodeSettings {
  bool append_eod = false;
  bool split_sentences = false;
  bool skip_invalid = false;
  std::size_t max_examples = 5;
};

// Parses and tokenizes every line of block.lines into block (a worker's job).
void encode_block(EncodedBlock& block, JsonFieldReader& fields, const Tokenizer& tokenizer,
                  const EncodeSettings& settings);

}  // namespace dlm::data::preprocess_detail
