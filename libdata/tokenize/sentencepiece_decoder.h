// SentencePiece's Decode (sentencepiece_processor.cc of sentencepiece 0.2.3), natively: ids -> text,
// as Python sentencepiece's decode(ids) gives it, for every model type.
//
// - Each id stands for the piece PieceToId finds for its own piece (the reserved map first).
// - A control piece writes nothing; the unknown piece writes the model's unk_surface (" \u2047 " by
//   default); every other piece its text with each U+2581 made a space.
// - A run of byte pieces (<0xXX>) is one byte string, written character by character: each
//   well-formed UTF-8 sequence as it is, each byte of an ill-formed one as U+FFFD.
// - The dummy prefix: while nothing has been written, a piece's leading U+2581 is dropped where
//   add_dummy_prefix or remove_extra_whitespaces is set. With remove_extra_whitespaces every such
//   leading piece loses one; without it only the first that had one does.
// Models with a denormalizer (a charsmap applied to the decoded text) are not taken.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sentencepiece_model.h"

namespace dlm::data::tok {

class SentencePieceDecoder {
 public:
  // Why `m` cannot be decoded here; nullopt when it can.
  static std::optional<std::string> unsupported(const SentencePieceModel& m);
  // `m` must be supported.
  explicit SentencePieceDecoder(const SentencePieceModel& m);

  // Every id must be in [0, the piece count).
  std::string decode(std::span<const std::int32_t> ids) const;

 private:
  enum class Kind : std::uint8_t { kText, kControl, kUnknown, kByte };
  struct Piece {
    Kind kind = Kind::kText;
    std::uint8_t byte = 0;       // kByte
    bool leading_mark = false;   // kText: the piece starts with U+2581
    std::string text;            // kText: the piece with U+2581 as spaces
  };
  std::vector<Piece> pieces_;  // by the id PieceToId gives for the piece
  std::vector<std::int32_t> canonical_;  // id -> PieceToId(IdToPiece(id))
  std::string unk_surface_;
  bool strip_dummy_ = false, remove_extra_ = false;
};

}  // namespace dlm::data::tok
