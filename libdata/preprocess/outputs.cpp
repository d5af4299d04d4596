// Output datasets. With --partitions P, Megatron writes P datasets (line i in partition i % P) and
// concatenates them; dlm writes the P partitions side by side in one pass, then concatenates them the
// same way, so the result is the same bytes.
#include "outputs.h"

#include <unistd.h>

#include <sys/stat.h>

#include <fmt/format.h>

namespace dlm::data::preprocess_detail {
namespace {

std::uint64_t file_size(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

void remove_dataset(const std::string& prefix) {
  ::unlink(bin_path(prefix).c_str());
  ::unlink(idx_path(prefix).c_str());
}

}  // namespace

OutputSet::OutputSet(const PreprocessOptions& options, DType dtype)
    : options_(options),
      dtype_(dtype),
      partitions_(options.partitions > 1 && !options.keep_sequential_samples ? options.partitions : 1) {
  for (const auto& key : options.json_keys) {
    auto& row = writers_.emplace_back();
    for (std::size_t p = 0; p < partitions_; ++p) {
      // Megatron's partition datasets are named {prefix}_{p}_{key}_{level}.
      std::string base = partitions_ == 1 ? options.output_prefix : fmt::format("{}_{}", options.output_prefix, p);
      row.push_back(std::make_unique<IndexedDatasetWriter>(output_name(base, key, options.split_sentences), dtype));
    }
  }
}

OutputSet::~OutputSet() {
  if (done_) return;
  writers_.clear();  // unfinalized writers remove their temporaries
  for (const auto& prefix : finalized_) remove_dataset(prefix);
}

void OutputSet::write(const EncodedBlock& block, std::uint64_t first_line) {
  for (std::size_t k = 0; k < block.keys.size(); ++k) {
    const KeyTokens& key = block.keys[k];
    std::size_t token = 0, sequence = 0;
    for (std::size_t d = 0; d < block.document_lines.size(); ++d) {
      std::size_t partition = partitions_ == 1 ? 0 : (first_line + block.document_lines[d]) % partitions_;
      std::span<const std::int32_t> lengths(key.lengths.data() + sequence, key.sequence_counts[d]);
      std::size_t n = 0;
      for (std::int32_t len : lengths) n += static_cast<std::size_t>(len);
      writers_[k][partition]->add_document(std::span(key.tokens).subspan(token, n), lengths);
      token += n;
      sequence += lengths.size();
    }
  }
}

void OutputSet::finish(std::vector<PreprocessOutput>& outputs, std::uint64_t& bytes_out) {
  outputs.clear();
  bytes_out = 0;
  for (std::size_t k = 0; k < writers_.size(); ++k) {
    PreprocessOutput out;
    out.key = options_.json_keys[k];
    out.prefix = output_name(options_.output_prefix, out.key, options_.split_sentences);
    std::vector<std::string> parts;
    for (auto& writer : writers_[k]) {
      out.documents += writer->num_documents();
      out.sequences += writer->num_sequences();
      out.tokens += writer->num_tokens();
      std::size_t p = parts.size();
      parts.push_back(partitions_ == 1 ? out.prefix
                                       : output_name(fmt::format("{}_{}", options_.output_prefix, p), out.key,
                                                     options_.split_sentences));
      finalized_.push_back(parts.back());
      writer->finalize();
    }
    if (partitions_ > 1) {
      IndexedDatasetWriter merged(out.prefix, dtype_);
      for (const auto& part : parts) merged.append(part);
      finalized_.push_back(out.prefix);
      merged.finalize();
      for (const auto& part : parts) remove_dataset(part);
    }
    bytes_out += file_size(bin_path(out.prefix)) + file_size(idx_path(out.prefix));
    outputs.push_back(std::move(out));
  }
  done_ = true;
}

}  // namespace dlm::data::preprocess_detail
