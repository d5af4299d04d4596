// SampleReader: GPTDataset._query_document_sample_shuffle_indices and __getitem__.
#include "dlm/data/sample_reader.h"

#include <string>

#include "dlm/common/error.h"

namespace dlm::data {

SampleReader::SampleReader(const SplitDataset& split, SampleOptions options)
    : split_(split), options_(options) {
  if (split_.datasets.empty()) fail("sample reader: the split has no datasets");
  const auto& c = split_.datasets.front()->config();
  seq_length_ = c.sequence_length;
  extra_ = c.add_extra_token_to_sequence ? 1 : 0;
}

std::vector<SamplePiece> SampleReader::pieces(std::size_t i) const {
  if (i >= size()) fail("sample " + std::to_string(i) + " is past the split's " + std::to_string(size()) + " samples");
  const auto [d, s] = split_.locate(i);
  const GptDataset& ds = *split_.datasets[d];
  const auto& index = ds.index();
  const auto row = static_cast<std::size_t>(index.shuffle_index[s]);
  const auto span = ds.sample_span(row);
  const auto& documents = index.document_index;
  std::vector<SamplePiece> out;
  for (std::int64_t p = span.first_doc; p <= span.last_doc; ++p) {
    const std::int64_t sequence = documents[static_cast<std::size_t>(p)];
    const std::size_t offset = p == span.first_doc ? static_cast<std::size_t>(span.first_offset) : 0;
    std::size_t length = IndexedDataset::npos;
    if (p == span.last_doc) {
      // The last piece ends at the next sample's start plus the shared extra token.
      const std::int64_t end = span.last_offset + extra_;
      length = static_cast<std::size_t>(end) - offset;
    }
    out.push_back({&ds.dataset(), sequence, ds.dataset().sequence_bytes(static_cast<std::size_t>(sequence), offset, length)});
  }
  return out;
}

void SampleReader::raw_tokens(std::size_t i, std::vector<std::int32_t>& out) const {
  out.clear();
  for (const auto& piece : pieces(i)) {
    const std::size_t width = dtype_size(piece.dataset->dtype());
    const std::size_t n = piece.bytes.size() / width;
    const std::size_t at = out.size();
    out.resize(at + n);
    widen_tokens(piece.dataset->dtype(), piece.bytes.data(), n, out.data() + at);
  }
  out.resize(static_cast<std::size_t>(seq_length_ + extra_), options_.pad);
}

void SampleReader::read(std::size_t i, Sample& out) const {
  std::vector<std::int32_t> text;
  raw_tokens(i, text);
  const auto L = static_cast<std::size_t>(seq_length_);
  const auto [d, s] = split_.locate(i);
  out.dataset = d;
  out.dataset_sample = s;
  out.tokens.assign(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(L));
  if (extra_) {
    out.labels.assign(text.begin() + 1, text.end());
  } else {
    out.labels.assign(text.begin() + 1, text.end());
    out.labels.push_back(options_.pad);
  }
  out.loss_mask.assign(L, 1.0f);
  out.position_ids.resize(L);
  out.segment_ids.assign(L, 0);
  std::int32_t position = 0, segment = 0;
  for (std::size_t k = 0; k < L; ++k) {
    out.position_ids[k] = options_.reset_position_ids ? position : static_cast<std::int32_t>(k);
    out.segment_ids[k] = options_.reset_attention_mask ? segment : 0;
    ++position;
    if (out.tokens[k] == options_.eod) {
      if (options_.eod_mask_loss) out.loss_mask[k] = 0.0f;
      position = 0;  // positions after an eod restart (Megatron subtracts i + 1 - prev)
      ++segment;
    }
  }
  for (std::size_t k = 0; k < L; ++k) {
    if (out.labels[k] == options_.pad) {
      out.loss_mask[k] = 0.0f;
      out.labels[k] = 0;
    }
    if (out.tokens[k] == options_.pad) out.tokens[k] = 0;
  }
}

}  // namespace dlm::data
