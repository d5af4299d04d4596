// The byte-pair-encoding model shared by every BPE kind (tokenizer.json BPE, GPT-2 vocab+merges,
// tiktoken ranks): a word is split into initial symbols, then the adjacent pair of lowest rank is
// merged, leftmost first, until no pair has a rank. `tokenizers` ranks a pair by its line in the
// merges list; tiktoken by the rank of the merged bytes. Both are "pair -> (rank, merged id)" here.
//
// Encoded words are cached per thread (bounded), so text that repeats its words, which is all
// text, costs one hash lookup per word after warm-up.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dlm::data::tok {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept;
};
using Vocab = std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>>;

// Open-addressing map from an ordered id pair to its merge.
class PairTable {
 public:
  struct Merge {
    std::uint32_t rank;
    std::int32_t id;
  };
  void reserve(std::size_t n);
  // A pair inserted twice keeps the later merge, as `tokenizers` does for a repeated merges line.
  void insert(std::int32_t a, std::int32_t b, Merge m);
  const Merge* find(std::int32_t a, std::int32_t b) const {
    if (slots_.empty()) return nullptr;
    const std::uint64_t key = pack(a, b);
    for (std::size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  struct Slot {
    std::uint64_t key = kEmpty;
    Merge merge{};
  };
  static std::uint64_t pack(std::int32_t a, std::int32_t b) {
    return (std::uint64_t{static_cast<std::uint32_t>(a)} << 32) | static_cast<std::uint32_t>(b);
  }
  // Every key bit reaches the low bits the mask keeps (a plain multiply left the high half of the
  // pair, the left id, almost out of the slot index, so pairs sharing a right id clustered).
  static std::size_t hash(std::uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return static_cast<std::size_t>(k);
  }
  void grow();
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

struct BpeModel {
  enum class Symbols { kBytes, kChars };
  Symbols symbols = Symbols::kBytes;  // initial symbols: one per byte, or one per UTF-8 character
  Vocab vocab;                        // token (raw bytes for byte-level models) -> id
  PairTable merges;
  std::array<std::int32_t, 256> byte_ids{};  // kBytes: the id of each single byte, -1 if none
  bool ignore_merges = false;  // a word that is itself a token is that token (Llama-3, tiktoken)
  std::optional<std::int32_t> unk;
  bool fuse_unk = false;
  bool byte_fallback = false;               // kChars: an unknown character becomes its <0xXX> bytes
  std::array<std::int32_t, 256> fallback_ids{};
  // kChars: each ASCII character's id in `vocab` (-1: none), once index_ascii() has run after
  // `vocab` is complete; until then every character is looked up in `vocab`.
  std::array<std::int32_t, 128> ascii_ids{};
  bool ascii_indexed = false;
  void index_ascii();

  BpeModel();
  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;
  // The merge loop without the cache (the reference the cache is tested against).
  void encode_word_uncached(std::string_view word, std::vector<std::int32_t>& out) const;

 private:
  void initial_symbols(std::string_view word, std::vector<std::int32_t>& ids) const;
  std::uint64_t instance_;  // tells one model's cached words from another's in a thread's cache
};

}  // namespace dlm::data::tok
