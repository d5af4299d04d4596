#include "sentencepiece_decoder.h"

#include <cstdio>
#include <string_view>
#include <unordered_map>

#include "text.h"

namespace dlm::data::tok {
namespace {

using Type = SentencePieceModel::PieceType;

constexpr std::string_view kMark = "\xE2\x96\x81";
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// ModelInterface's pieces_ map; the other types live in its reserved map, which PieceToId reads first.
bool in_pieces_map(Type t) { return t == Type::kNormal || t == Type::kUserDefined || t == Type::kUnused; }

// PieceToByte: the byte of "<0xXX>" (upper-case hex), or -1.
int piece_byte(const std::string& piece) {
  unsigned b = 0;
  char check[8];
  if (piece.size() != 6 || std::sscanf(piece.c_str(), "<0x%2X>", &b) != 1) return -1;
  std::snprintf(check, sizeof check, "<0x%02X>", b);
  return piece == check ? static_cast<int>(b) : -1;
}

// Writes a run of byte pieces' bytes: each well-formed sequence as it is, each byte of an
// ill-formed one as U+FFFD (sentencepiece's IsValidDecodeUTF8 consumes one byte there).
void flush_bytes(std::string& bytes, std::string& out) {
  for (std::size_t i = 0; i < bytes.size();) {
    const int n = utf8_sequence(bytes, i);
    if (n > 0) {
      out.append(bytes, i, static_cast<std::size_t>(n));
      i += static_cast<std::size_t>(n);
    } else {
      out += kReplacement;
      ++i;
    }
  }
  bytes.clear();
}

}  // namespace

std::optional<std::string> SentencePieceDecoder::unsupported(const SentencePieceModel& m) {
  if (!m.denormalizer.precompiled_charsmap.empty()) return "a denormalizer";
  for (std::size_t i = 0; i < m.pieces.size(); ++i)
    if (m.pieces[i].type == Type::kByte && piece_byte(m.pieces[i].piece) < 0)
      return "byte piece " + std::to_string(i) + " is not <0xXX>";
  return std::nullopt;
}

SentencePieceDecoder::SentencePieceDecoder(const SentencePieceModel& m)
    : unk_surface_(m.unk_surface),
      strip_dummy_(m.normalizer.add_dummy_prefix || m.normalizer.remove_extra_whitespaces),
      remove_extra_(m.normalizer.remove_extra_whitespaces) {
  std::unordered_map<std::string_view, std::int32_t> pieces, reserved;
  for (std::size_t i = 0; i < m.pieces.size(); ++i)
    (in_pieces_map(m.pieces[i].type) ? pieces : reserved).emplace(m.pieces[i].piece, static_cast<std::int32_t>(i));
  pieces_.resize(m.pieces.size());
  canonical_.resize(m.pieces.size());
  for (std::size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    const auto r = reserved.find(p.piece);
    canonical_[i] = r != reserved.end() ? r->second : pieces.at(p.piece);
    Piece& d = pieces_[i];
    switch (p.type) {
      case Type::kControl: d.kind = Kind::kControl; break;
      case Type::kUnknown: d.kind = Kind::kUnknown; break;
      case Type::kByte:
        d.kind = Kind::kByte;
        d.byte = static_cast<std::uint8_t>(piece_byte(p.piece));
        break;
      default:
        d.leading_mark = std::string_view(p.piece).starts_with(kMark);
        for (std::size_t k = 0; k < p.piece.size();) {
          if (std::string_view(p.piece).substr(k, kMark.size()) == kMark) {
            d.text += ' ';
            k += kMark.size();
          } else {
            d.text += p.piece[k++];
          }
        }
    }
  }
}

std::string SentencePieceDecoder::decode(std::span<const std::int32_t> ids) const {
  std::string out, bytes;
  bool leading = true;        // is_bos_ws: a leading U+2581 may still be dropped
  bool dropped_mark = false;  // bos_ws_seen: the last piece's one was (without remove_extra_whitespaces)
  for (const std::int32_t id : ids) {
    const Piece& p = pieces_[static_cast<std::size_t>(canonical_[static_cast<std::size_t>(id)])];
    if (p.kind == Kind::kByte) {
      bytes += static_cast<char>(p.byte);
      continue;
    }
    flush_bytes(bytes, out);
    if (dropped_mark || !out.empty()) leading = false;
    dropped_mark = false;
    if (p.kind == Kind::kControl) continue;
    if (p.kind == Kind::kUnknown) {
      out += unk_surface_;
      continue;
    }
    if (leading && strip_dummy_ && p.leading_mark) {
      out.append(p.text, 1);
      dropped_mark = !remove_extra_;
    } else {
      out += p.text;
    }
  }
  flush_bytes(bytes, out);
  return out;
}

}  // namespace dlm::data::tok
