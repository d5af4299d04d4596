// A SentencePiece BPE model encoded on dlm's BpeModel, id for id as libsentencepiece encodes it.
//
// What SentencePiece does (normalizer.cc, bpe_model.cc, sentencepiece_processor.cc), and how it maps:
// - Normalize. Without a precompiled charsmap the text is kept as it is; spaces become U+2581 when
//   escape_whitespaces, a dummy U+2581 goes in front (behind with treat_whitespace_as_suffix) when
//   add_dummy_prefix, and remove_extra_whitespaces drops leading spaces, repeated spaces and every
//   trailing U+2581 (a literal one too).
// - Split the normalized text into characters, except that user-defined symbols are matched
//   longest-first at each position and frozen (never merged). Here they cut the text instead.
// - Merge: repeatedly join the adjacent pair whose concatenation is a piece with the highest score,
//   leftmost on ties. That is BPE with "pair -> (rank, merged id)" where the rank orders the scores.
// - A symbol that is no piece is unk; runs of unk are fused into one, or with byte_fallback every
//   byte becomes its <0xXX> piece.
// Words: no merge can join two characters that no piece holds side by side, so the text is cut
// before a U+2581 that no piece has after the character in front of it, after one that no piece
// has before the next character, and between two ASCII characters that no piece holds in that
// order (unless both are unknown: their unk must fuse). Each word then goes through BpeModel's
// per-thread word cache.
//
// Anything else (word/char models, BPE with charsmaps such as nmt_nfkc, unused pieces that would be
// resegmented, pieces this scheme cannot name) is refused by unsupported() and left to libsentencepiece;
// unigram models go to sentencepiece_unigram.h.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "bpe.h"
#include "sentencepiece_model.h"

namespace dlm::data::tok {

class SentencePieceBpe {
 public:
  // Why this encoder cannot reproduce libsentencepiece on `m` exactly; nullopt when it can.
  static std::optional<std::string> unsupported(const SentencePieceModel& m);
  // `m` must be supported.
  explicit SentencePieceBpe(const SentencePieceModel& m);

  // Appends the ids of `text`, which must be valid UTF-8.
  void encode(std::string_view text, std::vector<std::int32_t>& out) const;
  // The normalized text (exposed for tests).
  void normalize(std::string_view text, std::string& out) const;

 private:
  struct CharSet {
    std::array<bool, 128> ascii{};
    std::unordered_set<char32_t> other;
    bool contains(char32_t c) const { return c < 128 ? ascii[c] : other.count(c) != 0; }
    void insert(char32_t c) { c < 128 ? void(ascii[c] = true) : void(other.insert(c)); }
  };
  struct UserSymbol {
    std::string text;
    std::int32_t id;
  };
  void encode_normalized(std::string_view s, std::vector<std::int32_t>& out) const;
  void encode_span(std::string_view s, std::vector<std::int32_t>& out) const;
  void encode_word(std::string_view w, std::vector<std::int32_t>& out) const;

  BpeModel bpe_;
  SentencePieceModel::Normalizer normalizer_;
  bool suffix_ = false;
  std::string space_;        // what a space becomes: U+2581 or " "
  bool cut_words_ = false;   // false when a word cut could split a run of unk that must be fused
  CharSet before_space_;     // characters that some piece has right before space_
  CharSet after_space_;      // characters that some piece has right after space_
  std::vector<std::uint8_t> ascii_cut_ = std::vector<std::uint8_t>(128 * 128);  // [a * 128 + b]: cut between a and b
  std::array<std::vector<UserSymbol>, 256> user_symbols_;  // by first byte, longest first
  std::array<bool, 256> user_first_{};
  bool has_user_symbols_ = false;
};

}  // namespace dlm::data::tok
