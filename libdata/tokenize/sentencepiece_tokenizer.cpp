// SentencePieceTokenizer / Llama2Tokenizer: a .model file through libsentencepiece itself, as
// megatron-core's SentencePieceTokenizer does (encode_as_ids: no bos/eos added; eod = eos).
#include <sentencepiece_processor.h>

#include "dlm/common/error.h"
#include "kinds.h"
#include "text.h"

namespace dlm::data::tok {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, std::string kind) : kind_(std::move(kind)) {
    const auto status = sp_.Load(path);
    if (!status.ok()) fail_at(path, "not a SentencePiece model: " + status.ToString());
    auto role = [&](int id) { return id >= 0 ? std::optional<std::int32_t>(id) : std::nullopt; };
    ids_.bos = role(sp_.bos_id());
    ids_.eos = ids_.eod = role(sp_.eos_id());
    ids_.pad = role(sp_.pad_id());
  }

  void encode(std::string_view text, std::vector<std::int32_t>& out) const override {
    std::string repaired;
    if (!valid_utf8(text)) text = repaired = repair_utf8(text);
    std::vector<int> ids;
    const auto status = sp_.Encode(absl::string_view(text.data(), text.size()), &ids);
    if (!status.ok()) fail("SentencePiece encode failed: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    for (int id : v)
      if (id < 0 || id >= sp_.GetPieceSize()) fail("SentencePieceTokenizer: cannot decode id " + std::to_string(id));
    std::string out;
    const auto status = sp_.Decode(v, &out);
    if (!status.ok()) fail("SentencePiece decode failed: " + status.ToString());
    return out;
  }
  std::size_t vocab_size() const override { return static_cast<std::size_t>(sp_.GetPieceSize()); }
  const SpecialIds& special_ids() const override { return ids_; }
  std::string_view kind() const override { return kind_; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  SpecialIds ids_;
  std::string kind_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerOptions& o) {
  if (o.model.empty()) fail(o.type + " needs --tokenizer-model (a SentencePiece .model file)");
  return std::make_unique<SentencePieceTokenizer>(o.model, o.type);
}

}  // namespace dlm::data::tok
