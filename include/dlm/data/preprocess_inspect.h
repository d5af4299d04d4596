// What a preprocessed dataset holds: counts, document lengths and the most frequent token ids, for
// `dlm-preprocess inspect`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dlm/data/indexed_dataset.h"
#include "dlm/data/tokenizer.h"

namespace dlm::data {

struct DatasetStats {
  std::uint64_t documents = 0, sequences = 0, tokens = 0, empty_documents = 0;
  std::uint64_t distinct_ids = 0;
  std::int64_t min_id = 0, max_id = 0;
  // Tokens per document: smallest, median, 90th and 99th percentile (nearest rank), largest, mean.
  std::uint64_t length_min = 0, length_p50 = 0, length_p90 = 0, length_p99 = 0, length_max = 0;
  double length_mean = 0;
  std::vector<std::pair<std::int32_t, std::uint64_t>> top_ids;  // most frequent first
};

// Reads every token once. `top` is how many of the most frequent ids to keep.
DatasetStats inspect_dataset(const IndexedDataset& dataset, std::size_t top = 10);

// The stats as lines for people; with a tokenizer, ids are shown with their text and the first
// `show_documents` documents are printed detokenized.
std::string format_stats(const IndexedDataset& dataset, const DatasetStats& stats, const Tokenizer* tokenizer,
                         std::size_t show_documents);

}  // namespace dlm::data
