// The parts of a SentencePiece ModelProto (sentencepiece_model.proto) that decide how text is
// encoded and decoded: pieces with scores and types, the model type, byte fallback, the unknown
// surface, and the normalizer and denormalizer specs.
//
// Debian's libsentencepiece-dev ships no generated protobuf headers, so the serialized proto that
// libsentencepiece hands back (serialized_model_proto) is read here straight from the protobuf
// wire format; only the fields below are kept, every other field is skipped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlm::data::tok {

struct SentencePieceModel {
  // ModelProto.SentencePiece.Type.
  enum class PieceType : std::int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  // TrainerSpec.ModelType.
  enum class ModelType : std::int32_t { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };

  struct Piece {
    std::string piece;
    float score = 0;
    PieceType type = PieceType::kNormal;
  };
  std::vector<Piece> pieces;  // index = id

  ModelType model_type = ModelType::kUnigram;  // proto defaults throughout
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  std::string unk_surface = " \xE2\x81\x87 ";  // what decoding writes for the unknown piece (U+2047)

  struct Normalizer {
    std::string name;
    std::string precompiled_charsmap;  // empty: no charsmap, the text is kept as it is
    bool add_dummy_prefix = true;
    bool remove_extra_whitespaces = true;
    bool escape_whitespaces = true;
  } normalizer;
  Normalizer denormalizer;  // applied to decoded text where it has a precompiled charsmap
};

// Parses a serialized ModelProto; throws dlm::Error naming `file`, the byte offset and the field
// when the bytes are not a well-formed proto.
SentencePieceModel parse_sentencepiece_model(std::string_view proto, const std::string& file);

std::string_view model_type_name(SentencePieceModel::ModelType t);

}  // namespace dlm::data::tok
