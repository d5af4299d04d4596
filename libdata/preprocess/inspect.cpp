// Dataset statistics for `dlm-preprocess inspect`.
#include "dlm/data/preprocess_inspect.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

namespace dlm::data {
namespace {

std::uint64_t nearest_rank(const std::vector<std::uint64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

// Printable text of an id: its decoding with control characters escaped.
std::string shown(const Tokenizer& tokenizer, std::int32_t id) {
  std::string text = tokenizer.decode(std::span(&id, 1));
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n') out += "\\n";
    else if (c < 0x20) out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  return out;
}

}  // namespace

DatasetStats inspect_dataset(const IndexedDataset& dataset, std::size_t top) {
  DatasetStats s;
  s.documents = dataset.num_documents();
  s.sequences = dataset.num_sequences();
  // Dense counts for ids below 2^24 (every real vocabulary); a map for anything larger.
  std::vector<std::uint64_t> dense;
  std::unordered_map<std::int32_t, std::uint64_t> sparse;
  std::vector<std::uint64_t> doc_lengths;
  doc_lengths.reserve(s.documents);
  const auto& documents = dataset.document_indices();
  std::vector<std::int32_t> tokens;
  for (std::size_t d = 0; d + 1 < documents.size(); ++d) {
    std::uint64_t length = 0;
    for (auto i = static_cast<std::size_t>(documents[d]); i < static_cast<std::size_t>(documents[d + 1]); ++i) {
      tokens.clear();
      dataset.read_sequence(i, tokens);
      length += tokens.size();
      for (std::int32_t id : tokens) {
        if (id >= 0 && id < (1 << 24)) {
          if (static_cast<std::size_t>(id) >= dense.size()) dense.resize(static_cast<std::size_t>(id) + 1);
          ++dense[static_cast<std::size_t>(id)];
        } else {
          ++sparse[id];
        }
      }
    }
    s.tokens += length;
    if (length == 0) ++s.empty_documents;
    doc_lengths.push_back(length);
  }
  std::vector<std::pair<std::int32_t, std::uint64_t>> counts(sparse.begin(), sparse.end());
  for (std::size_t id = 0; id < dense.size(); ++id) {
    if (dense[id] != 0) counts.emplace_back(static_cast<std::int32_t>(id), dense[id]);
  }
  s.distinct_ids = counts.size();
  if (!counts.empty()) {
    auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
    s.min_id = lo->first;
    s.max_id = hi->first;
  }
  std::size_t keep = std::min(top, counts.size());
  std::partial_sort(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(keep), counts.end(),
                    [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; });
  s.top_ids.assign(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(keep));
  std::sort(doc_lengths.begin(), doc_lengths.end());
  if (!doc_lengths.empty()) {
    s.length_min = doc_lengths.front();
    s.length_max = doc_lengths.back();
    s.length_mean = static_cast<double>(s.tokens) / static_cast<double>(doc_lengths.size());
  }
  s.length_p50 = nearest_rank(doc_lengths, 0.5);
  s.length_p90 = nearest_rank(doc_lengths, 0.9);
  s.length_p99 = nearest_rank(doc_lengths, 0.99);
  return s;
}

std::string format_stats(const IndexedDataset& dataset, const DatasetStats& s, const Tokenizer* tokenizer,
                         std::size_t show_documents) {
  std::string out = fmt::format("{}: dtype {}, {} documents ({} empty), {} sequences, {} tokens\n", dataset.prefix(),
                                dtype_name(dataset.dtype()), s.documents, s.empty_documents, s.sequences, s.tokens);
  out += fmt::format("tokens per document: min {}, median {}, p90 {}, p99 {}, max {}, mean {:.1f}\n", s.length_min,
                     s.length_p50, s.length_p90, s.length_p99, s.length_max, s.length_mean);
  out += fmt::format("token ids: {} distinct, from {} to {}\n", s.distinct_ids, s.min_id, s.max_id);
  out += "most frequent ids:\n";
  for (const auto& [id, count] : s.top_ids) {
    double share = s.tokens != 0 ? 100.0 * static_cast<double>(count) / static_cast<double>(s.tokens) : 0;
    out += fmt::format("  {:>8} {:>12} {:5.2f}%", id, count, share);
    if (tokenizer != nullptr) out += fmt::format("  \"{}\"", shown(*tokenizer, id));
    out += "\n";
  }
  if (tokenizer != nullptr) {
    for (std::size_t d = 0; d < std::min<std::size_t>(show_documents, s.documents); ++d) {
      out += fmt::format("--- document {} ---\n{}\n", d, tokenizer->decode(dataset.document(d)));
    }
  }
  return out;
}

}  // namespace dlm::data
