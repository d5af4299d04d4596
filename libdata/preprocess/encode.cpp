// Megatron's Encoder.encode, line by line over a block.
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "block.h"
#include "dlm/common/error.h"

namespace dlm::data {

std::string output_name(const std::string& prefix, const std::string& key, bool sentence_level) {
  return fmt::format("{}_{}_{}", prefix, key, sentence_level ? "sentence" : "document");
}

void encode_document(const Tokenizer& tokenizer, std::span<const std::string_view> sentences, bool append_eod,
                     std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& lengths) {
  const std::size_t first_token = tokens.size();
  // The .idx stores a sequence's length as int32; checked here so that the error names the line.
  auto length = [](std::size_t n) {
    if (n > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      fail(fmt::format("a sequence of {} tokens: the .idx holds at most 2^31-1 tokens per sequence", n));
    }
    return static_cast<std::int32_t>(n);
  };
  for (std::string_view sentence : sentences) {
    std::size_t before = tokens.size();
    tokenizer.encode(sentence, tokens);
    if (tokens.size() > before) lengths.push_back(length(tokens.size() - before));
  }
  if (append_eod && tokens.size() > first_token) {
    const auto& eod = tokenizer.special_ids().eod;
    if (!eod) fail(fmt::format("--append-eod: the {} tokenizer has no eod token", tokenizer.kind()));
    tokens.push_back(*eod);
    lengths.back() = length(static_cast<std::size_t>(lengths.back()) + 1);
  }
}

namespace preprocess_detail {
namespace {

// Lines longer than this reserve their ids up front.
constexpr std::size_t kLongLine = std::size_t{16} << 20;

// The error for a line: "FILE:LINE: message".
Error line_error(const EncodedBlock& block, std::uint64_t line, const std::string& message) {
  return Error(Location{*block.lines.file, block.lines.first_line + line}, message);
}

}  // namespace

void encode_block(EncodedBlock& block, JsonFieldReader& fields, const Tokenizer& tokenizer,
                  const EncodeSettings& settings) {
  const char* data = block.lines.bytes.data();
  const std::size_t used = block.lines.used;
  for (auto& k : block.keys) {
    k.tokens.clear();
    k.lengths.clear();
    k.sequence_counts.clear();
  }
  std::size_t pos = 0;
  std::uint64_t line = 0;
  for (; pos < used; ++line) {
    const char* nl = static_cast<const char*>(std::memchr(data + pos, '\n', used - pos));
    std::size_t end = nl != nullptr ? static_cast<std::size_t>(nl - data) : used;
    const std::size_t start = pos;
    std::string message = fields.read(data + pos, end - pos);
    pos = end + 1;
    if (message.empty() && settings.split_sentences) {
      for (std::size_t k = 0; k < fields.fields().size() && message.empty(); ++k) {
        if (!fields.fields()[k].is_array) {
          message = "--split-sentences expects each value already split into sentences (a JSON array of "
                    "strings); dlm-preprocess does not split text itself";
        }
      }
    }
    if (!message.empty()) {
      if (!settings.skip_invalid) {
        block.error = std::make_exception_ptr(line_error(block, line, message));
        return;
      }
      ++block.skipped;
      if (block.skipped_examples.size() < settings.max_examples) {
        block.skipped_examples.push_back(line_error(block, line, message).what());
      }
      continue;
    }
    try {
      for (std::size_t k = 0; k < block.keys.size(); ++k) {
        KeyTokens& out = block.keys[k];
        // A long document's ids would otherwise grow by doubling, its old copy alive at each step
        // (6 bytes a token at the peak). A token covers at least a byte of the line, so this is
        // mostly enough; the reserved pages that stay unused never become resident.
        if (end - start > kLongLine) out.tokens.reserve(out.tokens.size() + (end - start) + 16);
        std::size_t before = out.lengths.size();
        encode_document(tokenizer, fields.fields()[k].parts, settings.append_eod, out.tokens, out.lengths);
        out.sequence_counts.push_back(static_cast<std::uint32_t>(out.lengths.size() - before));
      }
    } catch (const Error& e) {
      // A tokenizer refusing text is not a per-line JSON problem: it always stops the run.
      block.error = std::make_exception_ptr(line_error(block, line, e.message()));
      return;
    }
    block.document_lines.push_back(static_cast<std::uint32_t>(line));
  }
  block.line_count = line;
}

}  // namespace preprocess_detail
}  // namespace dlm::data
