// A tokenizer for tests that need no tokenizer files: one id per UTF-8 byte (byte + 1), eod 0.
#pragma once

#include "dlm/data/tokenizer.h"

namespace dlm::data::testing {

class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer() { ids_.eod = 0; }
  void encode(std::string_view text, std::vector<std::int32_t>& out) const override {
    for (unsigned char c : text) out.push_back(static_cast<std::int32_t>(c) + 1);
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string s;
    for (auto id : ids) {
      if (id > 0) s.push_back(static_cast<char>(id - 1));
    }
    return s;
  }
  std::size_t vocab_size() const override { return 257; }
  const SpecialIds& special_ids() const override { return ids_; }
  std::string_view kind() const override { return "ByteTokenizer"; }

 private:
  SpecialIds ids_;
};

}  // namespace dlm::data::testing
