// Added tokens (tokenizer.json's added_tokens, tiktoken's special tokens): found in the text before
// pre-tokenization, leftmost first and longest at a position, like `tokenizers`' Aho-Corasick
// matcher (MatchKind::LeftmostLongest).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlm::data::tok {

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool lstrip = false;  // the match swallows white space on its left
  bool rstrip = false;  // ... and on its right
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);
  bool empty() const { return tokens_.empty(); }

  struct Piece {
    std::string_view text;  // empty when this piece is the token `id`
    std::int32_t id = -1;
  };
  // Splits `text` into runs of plain text and matched tokens, in order; empty runs are left out.
  void split(std::string_view text, std::vector<Piece>& out) const;

 private:
  // Index of the longest token matching at `text[i]`, or -1.
  int match_at(std::string_view text, std::size_t i) const;
  std::vector<AddedToken> tokens_;                 // longest first
  std::array<std::vector<std::uint16_t>, 256> by_first_{};  // token indices by first byte
  std::array<std::uint64_t, 4> first_{};            // bitset of possible first bytes
};

}  // namespace dlm::data::tok
