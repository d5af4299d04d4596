// SentencePieceTokenizer / Llama2Tokenizer: a .model file, as megatron-core's SentencePieceTokenizer
// encodes it (encode_as_ids: no bos/eos added; eod = eos).
//
// libsentencepiece always loads the file (it validates it). Decoding is native (sentencepiece_decoder.h)
// unless the model has a denormalizer or was turned to libsentencepiece. Encoding goes through dlm's
// native SentencePiece BPE (sentencepiece_bpe.h) or unigram (sentencepiece_unigram.h) when the model
// is one they reproduce exactly, and through libsentencepiece otherwise. Debian's 0.1.97 encodes BPE
// at 0.6x the speed of the 0.2.x that the Python package bundles, and segments unigram models
// differently from 0.2.x (its lattice breaks ties otherwise); the native encoders follow 0.2.x.
#include <sentencepiece_processor.h>

#include <cstring>
#include <optional>

#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "kinds.h"
#include "sentencepiece_bpe.h"
#include "sentencepiece_decoder.h"
#include "sentencepiece_model.h"
#include "sentencepiece_normalizer.h"
#include "sentencepiece_unigram.h"
#include "text.h"

namespace dlm::data::tok {
namespace {

using Type = SentencePieceModel::PieceType;

// Whether the pieces read from the proto are the ones libsentencepiece loaded (they must be; a
// difference would mean the proto was read wrongly here, so the native encoder is not used).
bool same_pieces(const SentencePieceModel& m, const sentencepiece::SentencePieceProcessor& sp) {
  if (static_cast<std::size_t>(sp.GetPieceSize()) != m.pieces.size()) return false;
  for (std::size_t i = 0; i < m.pieces.size(); ++i) {
    const int id = static_cast<int>(i);
    const auto& p = m.pieces[i];
    const float score = sp.GetScore(id);
    if (sp.IdToPiece(id) != p.piece || std::memcmp(&score, &p.score, sizeof score) != 0 ||
        sp.IsUnknown(id) != (p.type == Type::kUnknown) || sp.IsControl(id) != (p.type == Type::kControl) ||
        sp.IsByte(id) != (p.type == Type::kByte) || sp.IsUnused(id) != (p.type == Type::kUnused))
      return false;
  }
  return true;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, std::string kind, bool allow_native) : kind_(std::move(kind)) {
    // libsentencepiece throws on some malformed models (Darts' "zero-length key" for an empty piece, found by
    // sentencepiece_fuzz) instead of returning a status.
    sentencepiece::util::Status status;
    try {
      status = sp_.Load(path);
    } catch (const std::exception& e) {
      fail_at(path, std::string("not a SentencePiece model: ") + e.what());
    }
    if (!status.ok()) fail_at(path, "not a SentencePiece model: " + status.ToString());
    auto role = [&](int id) { return id >= 0 ? std::optional<std::int32_t>(id) : std::nullopt; };
    ids_.bos = role(sp_.bos_id());
    ids_.eos = ids_.eod = role(sp_.eos_id());
    ids_.pad = role(sp_.pad_id());

    const SentencePieceModel model = parse_sentencepiece_model(sp_.serialized_model_proto(), path);
    // Refused whatever the encoder: libsentencepiece 0.1.97 reads such a charsmap out of bounds.
    if (auto why = SentencePieceNormalizer::charsmap_error(model)) fail_at(path, "not a SentencePiece model: " + *why);
    if (!allow_native) {
      decoder_name_ = "libsentencepiece: native decoding was turned off";
    } else if (!same_pieces(model, sp_)) {
      decoder_name_ = "libsentencepiece: the pieces read from the proto differ from libsentencepiece's";
    } else if (auto why = SentencePieceDecoder::unsupported(model)) {
      decoder_name_ = "libsentencepiece: " + *why;
    } else {
      decoder_.emplace(model);
      decoder_name_ = "native";
    }
    if (!allow_native) {
      encoder_ = "libsentencepiece: the native encoder was turned off";
    } else if (!same_pieces(model, sp_)) {
      encoder_ = "libsentencepiece: the pieces read from the proto differ from libsentencepiece's";
    } else if (model.model_type == SentencePieceModel::ModelType::kUnigram) {
      if (auto why = SentencePieceUnigram::unsupported(model)) {
        encoder_ = "libsentencepiece: " + *why;
        // Said once per model, not silently: 0.1.97 segments unigram models differently from >= 0.2.
        log::warning("{}: a unigram model the native encoder does not take ({}): ids follow the system "
                     "libsentencepiece (Debian 12: 0.1.97), which can differ from Python sentencepiece >= 0.2",
                     path, *why);
      } else {
        unigram_.emplace(model);
        encoder_ = "native unigram";
      }
    } else if (auto why = SentencePieceBpe::unsupported(model)) {
      encoder_ = "libsentencepiece: " + *why;
    } else {
      bpe_.emplace(model);
      encoder_ = "native BPE";
    }
  }

  void encode(std::string_view text, std::vector<std::int32_t>& out) const override {
    if (unigram_) {  // checks UTF-8 as it normalizes
      if (!unigram_->encode(text, out)) unigram_->encode(repair_utf8(text), out);
      return;
    }
    std::string repaired;
    if (!valid_utf8(text)) text = repaired = repair_utf8(text);
    if (bpe_) {
      bpe_->encode(text, out);
      return;
    }
    std::vector<int> ids;
    const auto status = sp_.Encode(absl::string_view(text.data(), text.size()), &ids);
    if (!status.ok()) fail("SentencePiece encode failed: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    for (const std::int32_t id : ids)
      if (id < 0 || id >= sp_.GetPieceSize()) fail("SentencePieceTokenizer: cannot decode id " + std::to_string(id));
    if (decoder_) return decoder_->decode(ids);
    std::vector<int> v(ids.begin(), ids.end());
    std::string out;
    const auto status = sp_.Decode(v, &out);
    if (!status.ok()) fail("SentencePiece decode failed: " + status.ToString());
    return out;
  }
  std::size_t vocab_size() const override { return static_cast<std::size_t>(sp_.GetPieceSize()); }
  const SpecialIds& special_ids() const override { return ids_; }
  std::string_view kind() const override { return kind_; }
  const std::string& encoder() const { return encoder_; }
  const std::string& decoder() const { return decoder_name_; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  std::optional<SentencePieceBpe> bpe_;
  std::optional<SentencePieceUnigram> unigram_;
  std::optional<SentencePieceDecoder> decoder_;  // native decoding, where the model allows it
  std::string encoder_;
  std::string decoder_name_;
  SpecialIds ids_;
  std::string kind_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerOptions& o, bool native) {
  if (o.model.empty()) fail(o.type + " needs --tokenizer-model (a SentencePiece .model file)");
  return std::make_unique<SentencePieceTokenizer>(o.model, o.type, native);
}

std::string sentencepiece_encoder(const Tokenizer& t) {
  const auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&t);
  return sp ? sp->encoder() : std::string();
}

std::string sentencepiece_decoder(const Tokenizer& t) {
  const auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&t);
  return sp ? sp->decoder() : std::string();
}

}  // namespace dlm::data::tok
