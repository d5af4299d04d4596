#include "sentencepiece_unigram.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "bpe.h"
#include "thread_cache.h"


namespace dlm::data::tok {
namespace {

using Type = SentencePieceModel::PieceType;

// ModelInterface's pieces_ map (matched against the text); the other types live in its reserved map.
bool matched(Type t) { return t == Type::kNormal || t == Type::kUserDefined || t == Type::kUnused; }

// sentencepiece's OneCharLen: the length a lead byte announces, 1 for a continuation byte.
std::size_t one_char_len(unsigned char b) { return "\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[b >> 4]; }

// unigram_model.cc's kUnkPenalty and kScoreResetThreshold.
constexpr float kUnkPenalty = 10.0f;
constexpr float kScoreResetThreshold = 100000.0f;

// How the best path that ends at a byte position ends: where its last node starts, and its id. Its
// score lives apart (the lattice's hot loop reads scores only).
struct Back {
  std::int32_t start;
  std::int32_t id;
};

constexpr std::string_view kMarker = "\xE2\x96\x81";  // U+2581

}  // namespace

// A thread's cached segments for one model: direct-mapped, one 64-byte line per segment, so that a
// hit reads one line; a new segment replaces the one in its line. A segment is kept when its key
// (padded to 4 bytes) and its nodes fit the line's 11 words.
struct alignas(64) SentencePieceUnigram::SegmentCache::Line {
  std::uint64_t hash = 0;  // 0: empty
  float margin, top;       // m (rounded down to a float) and M0
  std::uint8_t key_len, nodes, chars, unused;
  std::int32_t words[11];  // the key's bytes, then each node: id in bits 0-21, its bytes in 22-28
  static void check_size() { static_assert(sizeof(Line) == 64); }
};

namespace {
constexpr std::size_t kLines = 1 << 14;
constexpr std::uint8_t kSeenOnce = 0xFF;  // Line::nodes of a segment seen once: no path yet
std::size_t key_words(std::size_t bytes) { return (bytes + 3) / 4; }
}  // namespace

SentencePieceUnigram::SegmentCache::Line& SentencePieceUnigram::SegmentCache::line(std::uint64_t h) {
  if (lines_.empty()) lines_.resize(kLines);
  return lines_[(h >> 32) & (kLines - 1)];
}

SentencePieceUnigram::SegmentCache& SentencePieceUnigram::SegmentCache::of(std::uint64_t owner) {
  return thread_cache<SegmentCache>(owner);
}

namespace {
std::atomic<std::uint64_t> next_owner{1};
}  // namespace

struct SentencePieceUnigram::Isolated {
  double margin = std::numeric_limits<double>::infinity();
  float top = 0;  // M0
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
    : normalizer_(m),
      byte_fallback_(m.byte_fallback),
      segments_(!m.treat_whitespace_as_suffix),
      cache_owner_(next_owner.fetch_add(1)) {
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
      keys.push_back({p.piece, id, score});
      reach_ = std::max(reach_, p.piece.size());
      segments_ = segments_ && p.piece.find(kMarker, 1) == std::string::npos;
    }
  }
  trie_ = PieceTrie(std::move(keys));
  // ModelInterface::PieceToId: the reserved map first, then the pieces, else unknown.
  for (unsigned b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto r = reserved.find(name);
    const auto p = pieces.find(name);
    byte_ids_[b] = r != reserved.end() ? r->second : p != pieces.end() ? p->second : unk_;
  }
}

void SentencePieceUnigram::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  thread_local std::string normalized;
  normalizer_.normalize(text, normalized);
  encode_normalized(normalized, out);
  if (normalized.capacity() > (std::size_t{64} << 20)) std::string().swap(normalized);  // one huge document
}

void SentencePieceUnigram::encode_lattice(const std::string& s, std::vector<std::int32_t>& out) const {
  if (s.empty()) return;
  thread_local std::vector<Node> path;
  path.clear();
  const auto* text = reinterpret_cast<const unsigned char*>(s.data());
  lattice<false>(text, 0, s.size(), 0.0f, path, nullptr);
  emit(text, path, out);
}

void SentencePieceUnigram::encode_normalized(const std::string& s, std::vector<std::int32_t>& out) const {
  if (!segments_) return encode_lattice(s, out);
  const std::size_t n = s.size();
  thread_local std::vector<Node> path;
  path.clear();
  const auto* text = reinterpret_cast<const unsigned char*>(s.data());
  SegmentCache& cache = SegmentCache::of(cache_owner_);
  float c = 0.0f;  // best at `pending`
  std::size_t pending = 0;  // the text before it went through a lattice or the cache
  // Segment ends are found by stepping through character starts as the lattice does (std::string
  // ends with a NUL, so the marker test stops there at the latest).
  for (std::size_t begin = 0; begin < n;) {
    std::size_t end = begin + std::min(one_char_len(text[begin]), n - begin);
    while (end < n) {
      const unsigned char b = text[end];
      if (b < 0x80) {
        ++end;
      } else if (b == 0xE2 && text[end + 1] == 0x96 && text[end + 2] == 0x81) {
        break;
      } else {
        end += std::min(one_char_len(b), n - end);
      }
    }
    const std::size_t len = end - begin;
    if (len >= kMinCachedSegment && len <= kMaxCachedSegment) {
      if (const auto* line = cached(cache, text, begin, end)) {
        if (pending < begin) c = lattice<false>(text, pending, begin, c, path, nullptr);
        pending = begin;
        if (const auto after = replay(*line, begin, c, path)) {
          c = *after;
          pending = end;
        }
      }
    }
    begin = end;
  }
  if (pending < n) lattice<false>(text, pending, n, c, path, nullptr);
  emit(text, path, out);
}

const SentencePieceUnigram::SegmentCache::Line* SentencePieceUnigram::cached(SegmentCache& cache,
                                                                             const unsigned char* text,
                                                                             std::size_t begin, std::size_t end) const {
  const std::size_t len = end - begin;
  const std::uint64_t h = StringHash{}(std::string_view(reinterpret_cast<const char*>(text) + begin, len)) | 1;
  SegmentCache::Line& line = cache.line(h);
  const std::size_t key = key_words(len);
  if (line.hash != h || line.key_len != len || std::memcmp(line.words, text + begin, len) != 0) {
    // Seen first: only the key is kept, and the lattice takes the segment (most segments seen once are
    // never seen again, and a run from 0 costs about as much as the lattice).
    line.hash = h;
    line.key_len = static_cast<std::uint8_t>(len);
    line.nodes = kSeenOnce;
    std::memset(line.words, 0, key * 4);
    std::memcpy(line.words, text + begin, len);
    return nullptr;
  }
  if (line.nodes != kSeenOnce) return &line;
  thread_local std::vector<Node> alone;
  alone.clear();
  Isolated iso;
  lattice<true>(text, begin, end, 0.0f, alone, &iso);
  if (key + alone.size() > std::size(line.words)) return nullptr;
  line.margin = static_cast<float>(iso.margin);
  if (static_cast<double>(line.margin) > iso.margin) line.margin = std::nextafter(line.margin, 0.0f);
  line.top = iso.top;
  line.nodes = static_cast<std::uint8_t>(alone.size());
  line.chars = 0;
  for (std::size_t i = begin; i < end; i += std::min(one_char_len(text[i]), end - i)) ++line.chars;
  auto from = static_cast<std::uint32_t>(begin);
  for (std::size_t i = 0; i < alone.size(); ++i) {
    line.words[key + i] = static_cast<std::int32_t>((alone[i].end - from) << 22) | alone[i].id;
    from = alone[i].end;
  }
  return &line;
}

std::optional<float> SentencePieceUnigram::replay(const SegmentCache::Line& line, std::size_t begin, float c,
                                                  std::vector<Node>& path) const {
  if (c < -kScoreResetThreshold || c > kScoreResetThreshold) c = 0.0f;  // the lattice's rescale at `begin`
  const double top = line.top, abs_c = std::fabs(static_cast<double>(c));
  const double bound = 8.0 * line.chars * (0x1p-24 * (top + 1.001 * (abs_c + top)) + FLT_TRUE_MIN);
  if (!((c == 0.0f || line.margin > bound) && abs_c + top + bound < kScoreResetThreshold)) return std::nullopt;
  auto at = static_cast<std::uint32_t>(begin);
  const std::int32_t* node = line.words + key_words(line.key_len);
  for (const std::int32_t* last = node + line.nodes; node != last; ++node) {
    const std::int32_t id = *node & PieceTrie::kMaxValue;
    at += static_cast<std::uint32_t>(*node) >> 22;
    c = (id == unk_ ? unk_score_ : trie_.weight(id)) + c;
    path.push_back(Node{at, id});
  }
  return c;
}

template <bool kIsolated>
float SentencePieceUnigram::lattice(const unsigned char* text, std::size_t begin, std::size_t end, float c,
                                    std::vector<Node>& path, Isolated* iso) const {
  const std::size_t n = end - begin;
  // An unreached end scores -inf, so any (finite) offer beats it, as any offer replaces none; and a
  // rescale leaves it unreached. Offers past `end` (pieces that end inside the U+2581 there) lead
  // nowhere: the arrays reach past it so that the hot loop needs no check (the isolated run drops them).
  const std::size_t size = kIsolated ? n + 1 : n + reach_ + 1;
  thread_local std::vector<float> score;
  thread_local std::vector<float> runner;  // kIsolated: the best offer each end turned down
  thread_local std::vector<Back> back;     // read only where an offer was taken
  score.assign(size, -std::numeric_limits<float>::infinity());
  score[0] = c;
  if (back.size() < size) back.resize(size);
  if constexpr (kIsolated) runner.assign(size, -std::numeric_limits<float>::infinity());
  text += begin;
  for (std::size_t start = 0; start < n;) {
    float here = score[start];
    if constexpr (kIsolated) {
      if (start > 0) iso->margin = std::min(iso->margin, static_cast<double>(here) - runner[start]);
    } else if (here < -kScoreResetThreshold || here > kScoreResetThreshold) {
      // Every end an offer reached lies within the longest node of a start before this one.
      const std::size_t reach = std::min(size - 1, start + reach_);
      for (std::size_t i = start; i <= reach; ++i) score[i] -= here;
      here = 0.0f;
    }
    const std::size_t mblen = std::min(one_char_len(text[start]), n - start);
    bool covered = false;  // some piece is exactly the character at `start`
    auto offer_to = [&](std::size_t to, float offer, std::int32_t id) {
      if constexpr (kIsolated) {
        if (to > n) return;
        iso->top = std::max(iso->top, std::fabs(offer));
        if (!(offer > score[to])) {
          runner[to] = std::max(runner[to], offer);
          return;
        }
        runner[to] = std::max(runner[to], score[to]);
      } else if (!(offer > score[to])) {
        return;
      }
      score[to] = offer;
      back[to] = Back{static_cast<std::int32_t>(start), id};
    };
    // The text ends with a NUL, on which every walk stops.
    trie_.prefixes(text + start, [&](std::size_t length, std::int32_t id) {
      offer_to(start + length, trie_.weight(id) + here, id);
      covered |= length == mblen;
    });
    if (!covered) offer_to(start + mblen, unk_score_ + here, unk_);
    start += mblen;
  }
  if constexpr (kIsolated) iso->margin = std::min(iso->margin, static_cast<double>(score[n]) - runner[n]);
  // Back from the end; the nodes go out reversed and are turned around.
  const std::size_t first = path.size();
  for (std::size_t at = n; at > 0;) {
    const Back& b = back[at];
    path.push_back(Node{static_cast<std::uint32_t>(begin + at), b.id});
    at = static_cast<std::size_t>(b.start);
  }
  std::reverse(path.begin() + static_cast<std::ptrdiff_t>(first), path.end());
  const float last = score[n];
  if (score.capacity() > (std::size_t{8} << 20)) {
    std::vector<float>().swap(score);
    std::vector<float>().swap(runner);
    std::vector<Back>().swap(back);
  }
  return last;
}

void SentencePieceUnigram::emit(const unsigned char* text, const std::vector<Node>& path,
                                std::vector<std::int32_t>& out) const {
  bool prev_unk = false;
  std::uint32_t start = 0;
  for (const Node& node : path) {
    const bool unk = node.id == unk_;
    if (unk && byte_fallback_) {
      for (std::uint32_t k = start; k < node.end; ++k) out.push_back(byte_ids_[text[k]]);
    } else if (!(unk && prev_unk)) {
      out.push_back(node.id);
    }
    prev_unk = unk;
    start = node.end;
  }
}

}  // namespace dlm::data::tok
