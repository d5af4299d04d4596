#include "sentencepiece_unigram.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_map>

#include "text.h"

namespace dlm::data::tok {
namespace {

using Type = SentencePieceModel::PieceType;

// ModelInterface's pieces_ map (matched against the text); the other types live in its reserved map.
bool matched(Type t) { return t == Type::kNormal || t == Type::kUserDefined || t == Type::kUnused; }

// sentencepiece's OneCharLen: the length a lead byte announces, 1 for a continuation byte.
std::size_t one_char_len(unsigned char b) { return "\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[b >> 4]; }

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581

// unigram_model.cc's kUnkPenalty and kScoreResetThreshold.
constexpr float kUnkPenalty = 10.0f;
constexpr float kScoreResetThreshold = 100000.0f;

// How the best path that ends at a byte position ends: where its last node starts, and its id. Its
// score lives apart (the lattice's hot loop reads scores only).
struct Back {
  std::int32_t start;
  std::int32_t id;
};

}  // namespace

std::optional<std::string> SentencePieceUnigram::unsupported(const SentencePieceModel& m) {
  if (m.model_type != SentencePieceModel::ModelType::kUnigram)
    return "a " + std::string(model_type_name(m.model_type)) + " model";
  if (auto why = SentencePieceNormalizer::unsupported(m)) return why;
  // Models sentencepiece 0.2 refuses to load are left to libsentencepiece too.
  std::size_t unknown = 0, matchable = 0;
  for (std::size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    if (p.piece.empty() || p.piece.size() >= 8000) return "piece " + std::to_string(i) + " is empty or too long";
    if (!std::isfinite(p.score)) return "piece " + std::to_string(i) + " has a score that is not finite";
    unknown += p.type == Type::kUnknown;
    matchable += matched(p.type);
  }
  if (unknown != 1) return std::to_string(unknown) + " unknown pieces";
  if (m.pieces.size() > static_cast<std::size_t>(PieceTrie::kMaxValue)) return "more pieces than the trie holds";
  if (matchable == 0) return "no piece to match";
  return std::nullopt;
}

SentencePieceUnigram::SentencePieceUnigram(const SentencePieceModel& m)
    : normalizer_(m, SentencePieceNormalizer::space_byte(m)),
      space_byte_(SentencePieceNormalizer::space_byte(m)),
      byte_fallback_(m.byte_fallback) {
  float min_score = FLT_MAX;
  for (const auto& p : m.pieces)
    if (p.type == Type::kNormal) min_score = std::min(min_score, p.score);
  unk_score_ = min_score - kUnkPenalty;

  // sentencepiece refuses a model with a piece twice in one map; libsentencepiece loaded this one.
  std::unordered_map<std::string_view, std::int32_t> pieces, reserved;
  std::vector<PieceTrie::Key> keys;
  for (std::size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    const auto id = static_cast<std::int32_t>(i);
    if (p.type == Type::kUnknown) unk_ = id;
    if (!matched(p.type)) {
      reserved.emplace(p.piece, id);
    } else if (pieces.emplace(p.piece, id).second && p.type != Type::kUnused) {
      // GetUserDefinedScore: 0.1 per byte past the first, computed in double and kept as a float.
      const float score =
          p.type == Type::kUserDefined ? static_cast<float>(0.1 * (static_cast<int>(p.piece.size()) - 1)) : p.score;
      // Matched against the normalizer's result, where U+2581 may be one byte.
      std::string key = p.piece;
      if (space_byte_)
        for (std::size_t k = 0; (k = key.find(kSpaceSymbol, k)) != std::string::npos;)
          key.replace(k, kSpaceSymbol.size(), 1, static_cast<char>(*space_byte_));
      keys.push_back({std::move(key), id, score});
      reach_ = std::max(reach_, keys.back().text.size());
    }
  }
  trie_ = PieceTrie(std::move(keys));
  for (unsigned b = 0; b < 256; ++b) char_len_[b] = static_cast<unsigned char>(one_char_len(static_cast<unsigned char>(b)));
  if (space_byte_) char_len_[*space_byte_] = 1;
  // ModelInterface::PieceToId: the reserved map first, then the pieces, else unknown.
  for (unsigned b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto r = reserved.find(name);
    const auto p = pieces.find(name);
    byte_ids_[b] = r != reserved.end() ? r->second : p != pieces.end() ? p->second : unk_;
  }
}

bool SentencePieceUnigram::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  thread_local std::string normalized;
  std::size_t n = normalizer_.normalize(text, normalized, true);
  if (n == SentencePieceNormalizer::kNotChecked) {
    if (!valid_utf8(text)) return false;
    n = normalizer_.normalize(text, normalized);
  }
  encode_normalized(std::string_view(normalized.data(), n), out);
  if (normalized.capacity() > (std::size_t{64} << 20)) std::string().swap(normalized);  // one huge document
  return true;
}

void SentencePieceUnigram::encode_normalized(std::string_view s, std::vector<std::int32_t>& out) const {
  const std::size_t n = s.size();
  if (n == 0) return;
  // An unreached end scores -inf, so any (finite) offer beats it, as any offer replaces none; and a
  // rescale leaves it unreached.
  thread_local std::vector<float> score;
  thread_local std::vector<Back> back;  // read only where an offer was taken
  score.assign(n + 1, -std::numeric_limits<float>::infinity());
  score[0] = 0.0f;
  if (back.size() < n + 1) back.resize(n + 1);
  const auto* text = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t start = 0; start < n;) {
    float here = score[start];
    if (here < -kScoreResetThreshold || here > kScoreResetThreshold) {
      // Every end an offer reached lies within the longest node of a start before this one.
      const std::size_t reach = std::min(n, start + reach_);
      for (std::size_t i = start; i <= reach; ++i) score[i] -= here;
      here = 0.0f;
    }
    const std::size_t mblen = std::min(std::size_t{char_len_[text[start]]}, n - start);
    bool covered = false;  // some piece is exactly the character at `start`
    // std::string ends with a NUL, on which every walk stops.
    trie_.prefixes(text + start, [&](std::size_t length, std::int32_t id) {
      const std::size_t end = start + length;
      const float offer = trie_.weight(id) + here;
      if (offer > score[end]) {
        score[end] = offer;
        back[end] = Back{static_cast<std::int32_t>(start), id};
      }
      covered |= length == mblen;
    });
    if (!covered) {
      const float offer = unk_score_ + here;
      const std::size_t end = start + mblen;
      if (offer > score[end]) {
        score[end] = offer;
        back[end] = Back{static_cast<std::int32_t>(start), unk_};
      }
    }
    start += mblen;
  }
  // Back from the end; the ids go out reversed and are turned around at the end (a run of unknown
  // nodes fuses the same read either way).
  const std::size_t first = out.size();
  bool prev_unk = false;
  for (std::size_t end = n; end > 0;) {
    const Back& b = back[end];
    const auto start = static_cast<std::size_t>(b.start);
    const bool unk = b.id == unk_;
    if (unk && byte_fallback_) {
      for (std::size_t k = end; k > start; --k) {
        if (space_byte_ && text[k - 1] == *space_byte_) {
          for (std::size_t b = kSpaceSymbol.size(); b > 0; --b) out.push_back(byte_ids_[static_cast<unsigned char>(kSpaceSymbol[b - 1])]);
        } else {
          out.push_back(byte_ids_[text[k - 1]]);
        }
      }
    } else if (!(unk && prev_unk)) {
      out.push_back(b.id);
    }
    prev_unk = unk;
    end = start;
  }
  std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  if (score.capacity() > (std::size_t{8} << 20)) {
    std::vector<float>().swap(score);
    std::vector<Back>().swap(back);
  }
}

}  // namespace dlm::data::tok
