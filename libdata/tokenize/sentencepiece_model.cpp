// Protobuf wire format (proto2), as much of it as a ModelProto needs: a tag is a varint
// (field << 3 | wire type); wire types 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
// Groups (3, 4) are not used by sentencepiece_model.proto and are refused. An enum value the proto
// does not define leaves the field as it was, as proto2's generated parser does.
#include "sentencepiece_model.h"

#include <bit>
#include <cstring>

#include "dlm/common/error.h"

namespace dlm::data::tok {
namespace {

class WireReader {
 public:
  WireReader(std::string_view data, std::size_t base, const std::string& file, const char* message)
      : data_(data), base_(base), file_(file), message_(message) {}

  bool done() const { return pos_ >= data_.size(); }
  std::size_t offset() const { return base_ + pos_; }

  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) bad("truncated varint");
      const auto b = static_cast<unsigned char>(data_[pos_++]);
      v |= std::uint64_t{b & 0x7Fu} << shift;
      if (b < 0x80) return v;
    }
    bad("varint longer than 10 bytes");
  }
  // Reads a tag; sets the field number and wire type.
  void tag(std::uint32_t& field, std::uint32_t& wire) {
    const std::uint64_t t = varint();
    field = static_cast<std::uint32_t>(t >> 3);
    wire = static_cast<std::uint32_t>(t & 7);
    if (field == 0) bad("field number 0");
  }
  // A length-delimited field.
  std::string_view bytes() {
    const std::uint64_t n = varint();
    if (n > data_.size() - pos_) bad("length " + std::to_string(n) + " runs past the end");
    const auto s = data_.substr(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  std::string_view string(std::uint32_t wire, const char* field) {
    expect(wire, 2, field);
    return bytes();
  }
  std::uint64_t varint(std::uint32_t wire, const char* field) {
    expect(wire, 0, field);
    return varint();
  }
  // Calls on_field(field, wire) for each field of the message; a field it does not take (returns
  // false) is skipped.
  template <class F>
  void fields(F&& on_field) {
    while (!done()) {
      std::uint32_t field, wire;
      tag(field, wire);
      if (!on_field(field, wire)) skip(wire);
    }
  }
  float fixed32_float() {
    if (data_.size() - pos_ < 4) bad("truncated fixed32");
    std::uint32_t u;
    std::memcpy(&u, data_.data() + pos_, 4);
    if constexpr (std::endian::native == std::endian::big) u = __builtin_bswap32(u);
    pos_ += 4;
    return std::bit_cast<float>(u);
  }
  void skip(std::uint32_t wire) {
    switch (wire) {
      case 0: varint(); return;
      case 1: need(8); pos_ += 8; return;
      case 2: bytes(); return;
      case 5: need(4); pos_ += 4; return;
      default: bad("wire type " + std::to_string(wire) + " is not used by ModelProto");
    }
  }
  // A field read with the wrong wire type.
  void expect(std::uint32_t wire, std::uint32_t want, const char* field) {
    if (wire != want) bad(std::string(field) + " has wire type " + std::to_string(wire));
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail_at_offset(file_, offset(), std::string("not a SentencePiece model: ") + message_ + ": " + what);
  }

 private:
  void need(std::size_t n) {
    if (data_.size() - pos_ < n) bad("truncated field");
  }
  std::string_view data_;
  std::size_t base_;
  std::size_t pos_ = 0;
  const std::string& file_;
  const char* message_;
};

SentencePieceModel::Piece parse_piece(std::string_view data, std::size_t base, const std::string& file) {
  WireReader r(data, base, file, "ModelProto.pieces");
  SentencePieceModel::Piece p;
  r.fields([&](std::uint32_t field, std::uint32_t wire) {
    if (field == 1) {
      p.piece = std::string(r.string(wire, "piece"));
    } else if (field == 2) {
      r.expect(wire, 5, "score");
      p.score = r.fixed32_float();
    } else if (field == 3) {
      if (const auto t = r.varint(wire, "type"); t >= 1 && t <= 6) p.type = static_cast<SentencePieceModel::PieceType>(t);
    } else {
      return false;
    }
    return true;
  });
  return p;
}

void parse_trainer_spec(std::string_view data, std::size_t base, const std::string& file, SentencePieceModel& m) {
  WireReader r(data, base, file, "ModelProto.trainer_spec");
  r.fields([&](std::uint32_t field, std::uint32_t wire) {
    if (field == 3) {
      const auto t = r.varint(wire, "model_type");
      if (t >= 1 && t <= 4) m.model_type = static_cast<SentencePieceModel::ModelType>(t);
    } else if (field == 24) {
      m.treat_whitespace_as_suffix = r.varint(wire, "treat_whitespace_as_suffix") != 0;
    } else if (field == 35) {
      m.byte_fallback = r.varint(wire, "byte_fallback") != 0;
    } else if (field == 44) {
      m.unk_surface = std::string(r.string(wire, "unk_surface"));
    } else {
      return false;
    }
    return true;
  });
}

void parse_normalizer_spec(std::string_view data, std::size_t base, const std::string& file, const char* what,
                           SentencePieceModel::Normalizer& n) {
  WireReader r(data, base, file, what);
  r.fields([&](std::uint32_t field, std::uint32_t wire) {
    switch (field) {
      case 1: n.name = std::string(r.string(wire, "name")); return true;
      case 2: n.precompiled_charsmap = std::string(r.string(wire, "precompiled_charsmap")); return true;
      case 3: n.add_dummy_prefix = r.varint(wire, "add_dummy_prefix") != 0; return true;
      case 4: n.remove_extra_whitespaces = r.varint(wire, "remove_extra_whitespaces") != 0; return true;
      case 5: n.escape_whitespaces = r.varint(wire, "escape_whitespaces") != 0; return true;
      default: return false;
    }
  });
}

}  // namespace

SentencePieceModel parse_sentencepiece_model(std::string_view proto, const std::string& file) {
  SentencePieceModel m;
  WireReader r(proto, 0, file, "ModelProto");
  r.fields([&](std::uint32_t field, std::uint32_t wire) {
    if (field < 1 || field > 5 || field == 4) return false;
    const std::string_view body = r.string(wire, field == 1   ? "pieces"
                                                 : field == 2 ? "trainer_spec"
                                                 : field == 3 ? "normalizer_spec"
                                                              : "denormalizer_spec");
    const std::size_t base = r.offset() - body.size();
    if (field == 1) {
      m.pieces.push_back(parse_piece(body, base, file));
    } else if (field == 2) {
      parse_trainer_spec(body, base, file, m);
    } else {
      parse_normalizer_spec(body, base, file, field == 3 ? "ModelProto.normalizer_spec" : "ModelProto.denormalizer_spec",
                            field == 3 ? m.normalizer : m.denormalizer);
    }
    return true;
  });
  return m;
}

std::string_view model_type_name(SentencePieceModel::ModelType t) {
  switch (t) {
    case SentencePieceModel::ModelType::kUnigram: return "unigram";
    case SentencePieceModel::ModelType::kBpe: return "bpe";
    case SentencePieceModel::ModelType::kWord: return "word";
    case SentencePieceModel::ModelType::kChar: return "char";
  }
  return "?";
}

}  // namespace dlm::data::tok
