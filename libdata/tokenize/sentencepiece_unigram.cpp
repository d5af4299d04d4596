#include "sentencepiece_unigram.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
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

}  // namespace

// How the best path that ends at a byte position ends: where its last node starts, and its id. Its
// score lives apart (the lattice's hot loop reads scores only).
struct SentencePieceUnigram::Back {
  std::int32_t start;
  std::int32_t id;
};

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
  // The best path passes through every space byte (a node ending there and one starting there)
  // where no key holds it past its first byte and it alone is a key (so no unknown node starts
  // there either, and a run of unknown nodes never goes on past it).
  if (space_byte_) {
    const char sb = static_cast<char>(*space_byte_);
    bool alone = false, inside = false;
    for (const auto& k : keys) {
      alone |= k.text.size() == 1 && k.text[0] == sb;
      inside |= k.text.find(sb, 1) != std::string::npos;
    }
    cut_at_space_ = alone && !inside;
  }
  trie_ = PieceTrie(std::move(keys));
  while ((std::size_t{1} << reach_shift_) < reach_) ++reach_shift_;
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

// The hot functions start on a cache line: where their loops fall within 64-byte lines moved their
// speed by a few percent, and aligned they no longer move with unrelated code.
[[gnu::aligned(64)]] void SentencePieceUnigram::encode_normalized(std::string_view s, std::vector<std::int32_t>& out) const {
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
  // The nodes from `start`, whose character has mblen bytes.
  auto offer_from = [&](std::size_t start, std::size_t mblen) {
    float here = score[start];
    if (here < -kScoreResetThreshold || here > kScoreResetThreshold) {
      // Every end an offer reached lies within the longest node of a start before this one.
      const std::size_t reach = std::min(n, start + reach_);
      for (std::size_t i = start; i <= reach; ++i) score[i] -= here;
      here = 0.0f;
    }
    bool covered = false;  // some piece is exactly the character at `start`
    // std::string ends with a NUL, on which every walk stops.
    trie_.prefixes(text + start, [&](std::size_t length, std::int32_t id, float weight) {
      const std::size_t end = start + length;
      const float offer = weight + here;
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
  };
  // The next start is this one plus its character's length: the loop's one chain from start to
  // start. Up to n - 4 no character (at most 4 bytes) reaches past the end, so the length needs no
  // clamp there; the last few starts take the clamped one (a character cut short by the end).
  std::size_t start = 0;
  for (const std::size_t clamp_from = n > 4 ? n - 4 : 0; start < clamp_from;) {
    const std::size_t mblen = char_len_[text[start]];
    offer_from(start, mblen);
    start += mblen;
  }
  while (start < n) {
    const std::size_t mblen = std::min(std::size_t{char_len_[text[start]]}, n - start);
    offer_from(start, mblen);
    start += mblen;
  }
  backtrack(back.data(), text, n, out);
  if (score.capacity() > (std::size_t{8} << 20)) {
    std::vector<float>().swap(score);
    std::vector<Back>().swap(back);
  }
}

[[gnu::aligned(64)]] void SentencePieceUnigram::backtrack(const Back* back, const unsigned char* text, std::size_t n,
                                                          std::vector<std::int32_t>& out) const {
  // Following back[] from the end is one chain of dependent loads, a node each. Where the best path
  // is known to pass through positions (cut_at_space_: the space bytes that start a character), the
  // stretches between up to kChains of them, about evenly apart, are followed side by side. Each
  // stretch's nodes go into its part of a per-thread buffer (a node is at least a byte), filled from
  // the part's end: the id, or for an unknown node ~end (negative), which the stretch's copy into
  // `out` then turns into its ids.
  constexpr std::size_t kChains = 4;
  std::array<std::size_t, kChains + 1> cut{};  // stretch j: (cut[j], cut[j + 1]]
  std::size_t chains = 1;
  // A space byte is a start of the lattice unless a lead byte up to 3 before it announces a character
  // that reaches over it (a replacement cut short in a malformed charsmap): such a byte is no cut.
  auto starts_here = [&](std::size_t p) {
    for (std::size_t k = 1; k <= 3 && k <= p; ++k)
      if (char_len_[text[p - k]] > k) return false;
    return true;
  };
  if (cut_at_space_ && n >= 64 * kChains) {
    const auto* found = text;
    for (std::size_t j = 1; j < kChains; ++j) {
      const auto* from = std::max(found + 1, text + j * n / kChains);
      for (;;) {
        const auto left = static_cast<std::size_t>(text + n - from);
        found = from < text + n ? static_cast<const unsigned char*>(std::memchr(from, *space_byte_, left)) : nullptr;
        if (found == nullptr || starts_here(static_cast<std::size_t>(found - text))) break;
        from = found + 1;
      }
      if (found == nullptr) break;
      cut[chains++] = static_cast<std::size_t>(found - text);
    }
  }
  cut[chains] = n;
  thread_local std::vector<std::int32_t> nodes;
  if (nodes.size() < n) nodes.resize(n);
  std::array<std::size_t, kChains> end{};
  std::array<std::int32_t*, kChains> to{};
  for (std::size_t j = 0; j < chains; ++j) end[j] = cut[j + 1], to[j] = nodes.data() + cut[j + 1];
  std::array<bool, kChains> unknown{};
  auto step = [&](std::size_t j) {
    const Back b = back[end[j]];
    const bool unk = b.id == unk_;
    unknown[j] |= unk;
    *--to[j] = unk ? ~static_cast<std::int32_t>(end[j]) : b.id;
    end[j] = static_cast<std::size_t>(b.start);
  };
  if (chains == kChains)
    for (;;) {
      // A node spans at most reach_ <= 2^reach_shift_ bytes: every stretch has that many nodes
      // left at least.
      std::size_t steps = n;
      for (std::size_t j = 0; j < kChains; ++j)
        steps = std::min(steps, (end[j] - cut[j] + (std::size_t{1} << reach_shift_) - 1) >> reach_shift_);
      if (steps == 0) break;
      for (; steps > 0; --steps)
        for (std::size_t j = 0; j < kChains; ++j) step(j);
    }
  for (std::size_t j = 0; j < chains; ++j)
    while (end[j] > cut[j]) step(j);
  for (std::size_t j = 0; j < chains; ++j) {
    const std::int32_t* v = to[j];
    const std::int32_t* const last = nodes.data() + cut[j + 1];
    if (!unknown[j]) {
      out.insert(out.end(), v, last);
      continue;
    }
    // An unknown node is its bytes' <0xXX> pieces with byte fallback; else a run of them is one
    // unknown id (no run goes on past a cut: no unknown node starts at a space byte there).
    while (v != last) {
      const std::int32_t* const known = v;
      while (v != last && *v >= 0) ++v;
      out.insert(out.end(), known, v);
      if (v == last) break;
      if (!byte_fallback_) {
        out.push_back(unk_);
        while (v != last && *v < 0) ++v;
        continue;
      }
      const auto e = static_cast<std::size_t>(~*v++);
      for (auto b = static_cast<std::size_t>(back[e].start); b < e; ++b) {
        if (space_byte_ && text[b] == *space_byte_) {
          for (const char c : kSpaceSymbol) out.push_back(byte_ids_[static_cast<unsigned char>(c)]);
        } else {
          out.push_back(byte_ids_[text[b]]);
        }
      }
    }
  }
  if (nodes.size() > (std::size_t{8} << 20)) std::vector<std::int32_t>().swap(nodes);
}

}  // namespace dlm::data::tok
