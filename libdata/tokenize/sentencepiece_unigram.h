// A SentencePiece unigram model encoded as sentencepiece 0.2.3 encodes it (EncodeAsIds), id for id.
//
// What sentencepiece 0.2.3 does (unigram_model.cc EncodeOptimized, sentencepiece_processor.cc
// EncodeOptimized), and what this reproduces exactly:
// - Normalize (sentencepiece_normalizer.h).
// - Viterbi over byte positions of the normalized text, in float throughout. For each character
//   start s, in order, every normal or user-defined piece that starts at s (shortest first) offers
//   best[s] + score to its end e, where a user-defined piece of n bytes scores 0.1 * (n - 1). When
//   no piece covers exactly the character at s, an unknown node of that one character offers
//   best[s] + (min_score - 10), min_score being the lowest normal score. An offer replaces e's best
//   when e has none yet or it is strictly greater, so the first offer wins ties: the earliest
//   start, then the shortest piece. When best[s] leaves [-1e5, 1e5], best[s] is subtracted from
//   every best at s and after that an offer reached (a rescale that moves float rounding, kept too).
// - Unused pieces are never offered. Each unknown node becomes, with byte_fallback, the <0xXX>
//   pieces of its bytes; without it, a run of unknown nodes becomes one unknown id.
//
// Segments, and what the per-thread cache may reuse. When no piece the lattice can offer (normal or
// user-defined) holds U+2581 anywhere but at its byte 0, and treat_whitespace_as_suffix is off, no
// node crosses a character start where U+2581 begins (a piece over it would hold it at byte > 0; an
// unknown node is one character): every path passes through each such position b, so best[b] is
// one float C and the text after b is an independent lattice started at C. The text splits into
// segments, each U+2581 starting one (a run of them gives one-character segments), and a segment's
// best path depends on its bytes and on C only. This is checked at load (caches_segments()).
//
// Why a segment's path still depends on C: the offers are float sums, so a near-tie can resolve one
// way from C = 0 and the other from C = -70000; and a rescale inside the segment moves rounding. So
// a segment of at most kMaxCachedSegment bytes, seen a second time, is run once from 0 with the same
// float code, and the cache keeps its path with: m, the least margin W - O over the offers O that the winning offer W
// of a reached character start (or the end) beat or tied (the first offer wins ties: an exact tie
// gives m = 0); M0, the largest |offer|; k, its characters (no path has more nodes). Reused from C:
// - Along a path the float value after i additions is within i * u * M of the exact sum, u = 2^-24,
//   M the largest magnitude on the way (from 0: M0; from C: |C| + M0 and that error, which k u < 2^-18
//   bounds by 1.001 (|C| + M0)). If the same decisions were taken before a position, each offer there
//   differs from C + (its isolated value) by at most e = k u (M0 + 1.001 (|C| + M0)) (plus k
//   subnormal steps), so
//   W - O from C is at least m - 2e > 0 when m > 2e: every decision, ties and strict wins alike, is
//   the same as the isolated one, position by position. The check asks m > 8e (a 4x margin), or
//   C == 0 (then the run is the isolated run, bit for bit).
// - No rescale inside: every best at a start stays below |C| + M0 + 8e < 1e5. One at the segment's
//   start (|C| > 1e5) is taken as the lattice takes it: C becomes 0.
// - Then the path's ids are appended, and the end score is the path's float additions replayed from C
//   in the lattice's order (unknown nodes min_score - 10, user-defined 0.1 (n - 1)), so the next
//   segment starts at the same C as the whole-text lattice. A segment that fails the check, is longer,
//   is seen first or does not fit a cache line runs through the exact lattice from C, together with
//   its neighbours that do too. Unknown-run fusing and byte fallback are applied to the whole text's
//   path afterwards.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "piece_trie.h"
#include "sentencepiece_model.h"
#include "sentencepiece_normalizer.h"

namespace dlm::data::tok {

class SentencePieceUnigram {
 public:
  // Why this encoder cannot reproduce sentencepiece >= 0.2 on `m`; nullopt when it can.
  static std::optional<std::string> unsupported(const SentencePieceModel& m);
  // `m` must be supported.
  explicit SentencePieceUnigram(const SentencePieceModel& m);

  // Appends the ids of `text`, which must be valid UTF-8.
  void encode(std::string_view text, std::vector<std::int32_t>& out) const;
  // Appends the ids of already normalized text (through the segment cache where the model allows).
  void encode_normalized(const std::string& s, std::vector<std::int32_t>& out) const;
  // The same ids from one lattice over the whole text, no cache: the reference the cache is tested against.
  void encode_lattice(const std::string& s, std::vector<std::int32_t>& out) const;
  // Whether the text splits into segments at U+2581 that the per-thread cache may reuse.
  bool caches_segments() const { return segments_; }

  // Segments of these many bytes go through the cache; the lattice takes the others as they come.
  static constexpr std::size_t kMinCachedSegment = 1, kMaxCachedSegment = 40;

 private:
  // A node of a best path: where it ends in the text, and its id (unk_ for an unknown node).
  struct Node {
    std::uint32_t end;
    std::int32_t id;
  };
  struct Isolated;     // what a segment's run from 0 tells (m, M0, k)
  class SegmentCache {  // a thread's cached segments for one model (sentencepiece_unigram.cpp)
   public:
    struct Line;
    Line& line(std::uint64_t h);
    static SegmentCache& of(std::uint64_t owner);
   private:
    std::vector<Line> lines_;
  };
  // The lattice over text[begin, end) from score c at begin; appends its best path, returns best[end].
  // kIsolated: from 0 without rescales, filling *iso.
  template <bool kIsolated>
  float lattice(const unsigned char* text, std::size_t begin, std::size_t end, float c, std::vector<Node>& path,
                Isolated* iso) const;
  // The cache's line for text[begin, end), filled by a run from 0 where it was not there; null
  // where the segment does not fit a line.
  const SegmentCache::Line* cached(SegmentCache& cache, const unsigned char* text, std::size_t begin,
                                   std::size_t end) const;
  // Appends the line's path from best c at `begin` and returns best at its end; nullopt where the
  // margin check fails.
  std::optional<float> replay(const SegmentCache::Line& line, std::size_t begin, float c,
                              std::vector<Node>& path) const;
  void emit(const unsigned char* text, const std::vector<Node>& path, std::vector<std::int32_t>& out) const;

  SentencePieceNormalizer normalizer_;
  PieceTrie trie_;
  std::size_t reach_ = 4;  // the most bytes one node spans: the longest matched piece, or a character
  float unk_score_ = 0;
  std::int32_t unk_ = 0;
  bool byte_fallback_ = false;
  std::array<std::int32_t, 256> byte_ids_{};
  bool segments_ = false;
  std::uint64_t cache_owner_ = 0;
};

}  // namespace dlm::data::tok
