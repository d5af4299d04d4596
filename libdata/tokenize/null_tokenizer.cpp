// NullTokenizer: the text is already ids, written as decimal integers separated by single spaces
// (Megatron's text.split(' ') then int()); eod is the id one past --vocab-size.
#include "kinds.h"

#include <charconv>

#include "dlm/common/error.h"

namespace dlm::data::tok {
namespace {

class NullTokenizer final : public Tokenizer {
 public:
  explicit NullTokenizer(std::size_t vocab) : vocab_(vocab) { ids_.eod = static_cast<std::int32_t>(vocab); }

  void encode(std::string_view text, std::vector<std::int32_t>& out) const override {
    std::size_t at = 0;
    while (true) {
      const std::size_t end = std::min(text.find(' ', at), text.size());
      std::string_view field = text.substr(at, end - at);
      // Python's int() allows surrounding white space and a sign.
      while (!field.empty() && std::isspace(static_cast<unsigned char>(field.front()))) field.remove_prefix(1);
      while (!field.empty() && std::isspace(static_cast<unsigned char>(field.back()))) field.remove_suffix(1);
      if (!field.empty() && field.front() == '+') field.remove_prefix(1);
      std::int64_t v = 0;
      const auto [p, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
      if (field.empty() || ec != std::errc() || p != field.data() + field.size() || v < INT32_MIN || v > INT32_MAX)
        fail("NullTokenizer: byte " + std::to_string(at) + ": expected an integer id, got \"" +
             std::string(text.substr(at, std::min<std::size_t>(end - at, 40))) + "\"");
      out.push_back(static_cast<std::int32_t>(v));
      if (end == text.size()) break;
      at = end + 1;
    }
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string s;
    for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
    return s;
  }
  std::size_t vocab_size() const override { return vocab_ + 1; }
  const SpecialIds& special_ids() const override { return ids_; }
  std::string_view kind() const override { return "NullTokenizer"; }

 private:
  std::size_t vocab_;
  SpecialIds ids_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_null_tokenizer(const TokenizerOptions& o) {
  if (!o.vocab_size) fail("NullTokenizer needs --vocab-size");
  return std::make_unique<NullTokenizer>(*o.vocab_size);
}

}  // namespace dlm::data::tok
