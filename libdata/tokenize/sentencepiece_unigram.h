// A SentencePiece unigram model encoded as sentencepiece 0.2.3 encodes it (EncodeAsIds), id for id.
//
// What sentencepiece 0.2.3 does (unigram_model.cc EncodeOptimized, sentencepiece_processor.cc
// EncodeOptimized), and what this reproduces exactly:
// - Normalize (sentencepiece_normalizer.h). Here U+2581 comes out as one byte (0xFF, which valid
//   UTF-8 never holds) and the pieces' U+2581 likewise: the same matches, fewer bytes to walk.
// - Viterbi over byte positions of the normalized text, in float throughout. For each character
//   start s, in order, every normal or user-defined piece that starts at s (shortest first) offers
//   best[s] + score to its end e, where a user-defined piece of n bytes scores 0.1 * (n - 1). When
//   no piece covers exactly the character at s, an unknown node of that one character offers
//   best[s] + (min_score - 10), min_score being the lowest normal score. An offer replaces e's best
//   when e has none yet or it is strictly greater, so the first offer wins ties: the earliest
//   start, then the shortest piece. When best[s] leaves [-1e5, 1e5], best[s] is subtracted from
//   every best at s and after that an offer reached (a rescale that moves float rounding, kept too).
// - Unused pieces are never offered. Each unknown node becomes, with byte_fallback, the <0xXX>
//   pieces of its bytes; without it, a run of unknown nodes becomes one unknown id.
// The whole text is one lattice. best[] is rounded to float along the way, so a segmentation near a
// tie depends on the score of all that precedes it; a per-segment result (the text between two
// U+2581, when no piece holds U+2581 past its byte 0) is reusable exactly only where its decision
// margins exceed the float error at that score, and such a cache costs about as much per segment as
// this lattice does (docs/performance.md has the design and its numbers).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "piece_trie.h"
#include "sentencepiece_model.h"
#include "sentencepiece_normalizer.h"

namespace dlm::data::tok {

class SentencePieceUnigram {
 public:
  // Why this encoder cannot reproduce sentencepiece >= 0.2 on `m`; nullopt when it can.
  static std::optional<std::string> unsupported(const SentencePieceModel& m);
  // `m` must be supported.
  explicit SentencePieceUnigram(const SentencePieceModel& m);

  // Appends the ids of `text` and returns true; false, appending nothing, where `text` is not valid
  // UTF-8 (checked as it is normalized; the caller repairs it).
  bool encode(std::string_view text, std::vector<std::int32_t>& out) const;

 private:
  // Appends the ids of the normalizer's result `s`, which a NUL follows.
  void encode_normalized(std::string_view s, std::vector<std::int32_t>& out) const;
  struct Back;
  // Appends the ids of the best path to `n` that `back` (by end position) holds, in text order.
  void backtrack(const Back* back, const unsigned char* text, std::size_t n, std::vector<std::int32_t>& out) const;

  SentencePieceNormalizer normalizer_;
  std::optional<unsigned char> space_byte_;  // U+2581 in the normalizer's result (and in trie_'s keys)
  std::array<unsigned char, 256> char_len_{};  // by lead byte: the bytes of a character (OneCharLen)
  PieceTrie trie_;
  std::size_t reach_ = 4;  // the most bytes one node spans: the longest matched piece, or a character
  unsigned reach_shift_ = 0;  // the least power of two >= reach_
  float unk_score_ = 0;
  std::int32_t unk_ = 0;
  bool byte_fallback_ = false;
  bool cut_at_space_ = false;  // the best path passes through every space_byte_ (backtrack())
  std::array<std::int32_t, 256> byte_ids_{};
};

}  // namespace dlm::data::tok
