// SentencePiece's normalizer (normalizer.cc of sentencepiece >= 0.2), byte for byte: the text a
// model's pieces are matched against.
//
// At each position the longest of these rules applies, tried in this order:
// - a user-defined piece that starts here (the longest one) is kept as it is, never normalized;
// - the longest rule of the precompiled charsmap that matches here (a Darts-clone double-array trie
//   over UTF-8 keys; each value is the offset of a NUL-terminated replacement behind the trie);
// - otherwise the character is kept.
// Then: remove_extra_whitespaces drops spaces at the start, spaces that follow a replacement ending
// in a space, and every trailing space (U+2581 when escaped, a literal one too); escape_whitespaces
// writes each space as U+2581; add_dummy_prefix puts one space in front, or behind with
// treat_whitespace_as_suffix. The unigram encoder has U+2581 written as one byte (space_byte()), so
// that its lattice walks one byte where the text had a space.
//
// The charsmap is read where the model holds it; a malformed one is refused by unsupported() (the
// caller falls back to libsentencepiece), and lookups stay inside it whatever its contents.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sentencepiece_model.h"

namespace dlm::data::tok {

class SentencePieceNormalizer {
 public:
  // Why `m`'s normalizer cannot be reproduced; nullopt when it can.
  static std::optional<std::string> unsupported(const SentencePieceModel& m);
  // What is wrong with `m`'s precompiled charsmap, if anything: sizes sentencepiece 0.2 refuses, or
  // a trie step or a rule that would read outside the blob (libsentencepiece 0.1.97 does not check).
  static std::optional<std::string> charsmap_error(const SentencePieceModel& m);
  // The byte that stands for U+2581 in the result where `m` allows it (space_byte()), else nullopt.
  // 0xFF is never in valid UTF-8; it may then be in no piece and no rule's replacement.
  static std::optional<unsigned char> space_byte(const SentencePieceModel& m);
  // `m` must be supported. With `space_byte` (from space_byte(m)), each U+2581 of the result (an
  // escaped space, or one the text, a rule or a user-defined piece holds) is that one byte instead.
  explicit SentencePieceNormalizer(const SentencePieceModel& m, std::optional<unsigned char> space_byte = std::nullopt);
  // Views into its own charsmap copy: neither copied nor moved.
  SentencePieceNormalizer(const SentencePieceNormalizer&) = delete;
  SentencePieceNormalizer& operator=(const SentencePieceNormalizer&) = delete;

  // Writes the result at the start of `buf` followed by a NUL and returns its length; `buf` grows as
  // needed and never shrinks (its size is not the result's). `text` must be valid UTF-8, unless
  // `check`: then kNotChecked where a character or a rule's span is not whole UTF-8 (the text is
  // then ill-formed, or a rule ends inside a character: valid_utf8() tells).
  static constexpr std::size_t kNotChecked = static_cast<std::size_t>(-1);
  std::size_t normalize(std::string_view text, std::string& buf, bool check = false) const;

 private:
  // The replacement for the start of `s` (non-empty) and how many bytes of `s` it consumes.
  std::pair<std::string_view, std::size_t> prefix(std::string_view s) const;
  // The length of the longest charsmap rule at the start of `s` (0: none); sets its value.
  std::size_t charsmap_match(std::string_view s, std::uint32_t& value) const;
  std::string_view replacement(std::uint32_t value) const;

  std::string charsmap_;                // the model's precompiled_charsmap
  const std::uint32_t* units_ = nullptr;  // the double array inside charsmap_ (aligned copy below)
  std::vector<std::uint32_t> unit_store_;
  std::string_view replacements_;       // NUL-separated replacements behind the trie
  bool add_dummy_prefix_, remove_extra_, escape_, suffix_;
  std::string_view space_;              // what a space becomes: U+2581 or " "
  // Per ASCII byte that starts no rule with a second ASCII byte: its own result, which holds when
  // ASCII or the end follows, or always where ascii_simple_ (where no user-defined piece starts).
  std::array<std::string_view, 128> ascii_;
  std::array<bool, 128> ascii_simple_{};  // no rule reaches past the byte
  // Per byte, for the loop over plain ASCII: kCopy (kept as it is, and no space), kSpace (becomes
  // one space, and that is one byte), kAnyNext (no rule reaches past it, so the next byte does not
  // matter), kUser (kCopy or kSpace, but a user-defined piece starts with it: look for one first),
  // kPlain (kCopy or kSpace, and not kUser); plain_byte_ is what kCopy or kSpace writes.
  static constexpr unsigned char kCopy = 1, kSpace = 2, kAnyNext = 4, kUser = 8, kPlain = 16;
  std::array<unsigned char, 256> plain_byte_{};
  std::array<unsigned char, 256> plain_{};
  bool any_user_ = false;  // some byte is kUser
  // Every printable ASCII byte is kept (' ' is one space) or kUser; block_user_: how the user-defined
  // pieces with a printable first byte start, for the eight-byte loop (at most kBlockUsers).
  bool printable_plain_ = false;
  struct BlockUser {
    std::uint64_t first, second;  // each byte repeated eight times
    bool alone;                   // the piece is its first byte alone
    bool operator==(const BlockUser&) const = default;
  };
  static constexpr std::size_t kBlockUsers = 4;
  std::array<BlockUser, kBlockUsers> block_user_{};
  std::size_t block_users_ = 0;
  std::optional<unsigned char> space_byte_;
  // Appends `rep` (the result at one position) at `w`, its spaces escaped and its U+2581 written
  // as space_byte_; returns the new end.
  std::size_t emit(std::string_view rep, std::string& buf, std::size_t w) const;
  std::array<std::vector<std::string>, 256> user_;  // user-defined pieces by first byte, longest first
  std::array<bool, 256> user_first_{};              // some user-defined piece starts with the byte
  // Bit (a << 8 | b): some user-defined piece starts with bytes a b, or is a alone.
  std::vector<std::uint64_t> user_pair_ = std::vector<std::uint64_t>(1024);
  bool user_pair(unsigned a, unsigned b) const { return (user_pair_[a << 2 | b >> 6] >> (b & 63)) & 1; }
  // Bit (a << 8 | b): a charsmap rule is a alone or starts with bytes a b.
  std::vector<std::uint64_t> rule_pair_ = std::vector<std::uint64_t>(1024);
  bool rule_pair(unsigned a, unsigned b) const { return (rule_pair_[a << 2 | b >> 6] >> (b & 63)) & 1; }
  // The length of the longest user-defined piece at the start of `s` (non-empty); 0: none.
  std::size_t user_at(std::string_view s) const;
};

}  // namespace dlm::data::tok
