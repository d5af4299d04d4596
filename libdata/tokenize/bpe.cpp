#include "bpe.h"

#include <atomic>
#include <cstring>
#include <queue>

#include "text.h"

namespace dlm::data::tok {
namespace {

std::uint64_t mix(std::uint64_t h) {
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

std::uint64_t hash_bytes(std::string_view s) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
  }
  std::uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  return mix((h ^ tail) * 0x94D049BB133111EBull);
}

// A thread's cache of encoded words for one model: open addressing over (hash, key, ids) records
// kept in two arenas. Bounded: it is emptied when either arena or the table fills up.
class WordCache {
 public:
  static constexpr std::size_t kSlots = 1 << 17;
  static constexpr std::size_t kMaxEntries = kSlots / 2;
  static constexpr std::size_t kMaxKeyBytes = 8 << 20;
  static constexpr std::size_t kMaxWord = 128;

  const std::int32_t* find(std::string_view word, std::uint64_t h, std::uint32_t& n) const {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = h & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return nullptr;
      if (s.hash == h && s.key_len == word.size() &&
          std::memcmp(keys_.data() + s.key_off, word.data(), word.size()) == 0) {
        n = s.ids_len;
        return ids_.data() + s.ids_off;
      }
    }
  }
  void insert(std::string_view word, std::uint64_t h, const std::int32_t* ids, std::size_t n) {
    if (slots_.empty()) slots_.resize(kSlots);
    if (entries_ >= kMaxEntries || keys_.size() + word.size() > kMaxKeyBytes) clear();
    std::size_t i = h & (kSlots - 1);
    while (slots_[i].hash != 0) i = (i + 1) & (kSlots - 1);
    slots_[i] = {h, static_cast<std::uint32_t>(keys_.size()), static_cast<std::uint32_t>(word.size()),
                 static_cast<std::uint32_t>(ids_.size()), static_cast<std::uint32_t>(n)};
    keys_.append(word);
    ids_.insert(ids_.end(), ids, ids + n);
    ++entries_;
  }

 private:
  struct Slot {
    std::uint64_t hash = 0;
    std::uint32_t key_off = 0, key_len = 0, ids_off = 0, ids_len = 0;
  };
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    entries_ = 0;
  }
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<std::int32_t> ids_;
  std::size_t entries_ = 0;
};

WordCache& cache_for(std::uint64_t model) {
  struct Caches {
    std::uint64_t owner[4] = {0, 0, 0, 0};
    WordCache cache[4];
    unsigned next = 0;
  };
  thread_local Caches caches;
  for (int i = 0; i < 4; ++i)
    if (caches.owner[i] == model) return caches.cache[i];
  const unsigned slot = caches.next++ % 4;
  caches.owner[slot] = model;
  caches.cache[slot] = WordCache{};
  return caches.cache[slot];
}

std::atomic<std::uint64_t> next_instance{1};

constexpr std::uint32_t kNoRank = ~std::uint32_t{0};

// Merge loop for short words: keeps the rank of every adjacent pair, rescans for the minimum.
void merge_short(const PairTable& merges, std::vector<std::int32_t>& ids) {
  std::size_t n = ids.size();
  std::uint32_t rank[64];
  std::int32_t result[64];
  auto fill = [&](std::size_t i) {
    const auto* m = merges.find(ids[i], ids[i + 1]);
    rank[i] = m ? m->rank : kNoRank;
    result[i] = m ? m->id : 0;
  };
  for (std::size_t i = 0; i + 1 < n; ++i) fill(i);
  while (n > 1) {
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNoRank) break;
    ids[best] = result[best];
    for (std::size_t i = best + 1; i + 1 < n; ++i) ids[i] = ids[i + 1];
    for (std::size_t i = best + 1; i + 2 < n; ++i) {
      rank[i] = rank[i + 1];
      result[i] = result[i + 1];
    }
    --n;
    ids.resize(n);
    if (best + 1 < n) fill(best);
    if (best > 0) fill(best - 1);
  }
}

// Merge loop for long words (a Metaspace tokenizer that does not split hands BPE whole lines):
// a heap of candidate pairs over a linked list of symbols, O(n log n).
void merge_long(const PairTable& merges, std::vector<std::int32_t>& ids) {
  const std::size_t n = ids.size();
  std::vector<std::int32_t> prev(n), next(n);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<std::int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<std::int32_t>(i + 1) : -1;
  }
  struct Cand {
    std::uint32_t rank;
    std::int32_t pos, left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto push = [&](std::int32_t i) {
    if (i < 0 || next[i] < 0) return;
    if (const auto* m = merges.find(ids[i], ids[next[i]])) heap.push({m->rank, i, ids[i], ids[next[i]], m->id});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(static_cast<std::int32_t>(i));
  std::vector<char> alive(n, 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const std::int32_t r = next[c.pos];
    if (!alive[c.pos] || r < 0 || ids[c.pos] != c.left || ids[r] != c.right) continue;  // stale
    ids[c.pos] = c.merged;
    alive[r] = 0;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  std::size_t w = 0;
  for (std::int32_t i = 0; i >= 0; i = next[i]) ids[w++] = ids[i];
  ids.resize(w);
}

}  // namespace

std::size_t StringHash::operator()(std::string_view s) const noexcept { return hash_bytes(s); }

void PairTable::reserve(std::size_t n) {
  std::size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
  for (const auto& s : old)
    if (s.key != kEmpty) insert(static_cast<std::int32_t>(s.key >> 32), static_cast<std::int32_t>(s.key), s.merge);
}

void PairTable::grow() { reserve(std::max<std::size_t>(16, size_ * 2 + 2)); }

void PairTable::insert(std::int32_t a, std::int32_t b, Merge m) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const std::uint64_t key = pack(a, b);
  for (std::size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.merge = m;
      return;
    }
    if (s.key == kEmpty) {
      s.key = key;
      s.merge = m;
      ++size_;
      return;
    }
  }
}

BpeModel::BpeModel() : instance_(next_instance.fetch_add(1)) {
  byte_ids.fill(-1);
  fallback_ids.fill(-1);
}

void BpeModel::initial_symbols(std::string_view word, std::vector<std::int32_t>& ids) const {
  bool last_unk = false;
  auto unknown = [&] {
    if (!unk) return;  // `tokenizers` drops what it cannot name when there is no unk token
    if (!(fuse_unk && last_unk)) ids.push_back(*unk);
    last_unk = true;
  };
  if (symbols == Symbols::kBytes) {
    for (unsigned char b : word) {
      if (byte_ids[b] >= 0) {
        ids.push_back(byte_ids[b]);
        last_unk = false;
      } else {
        unknown();
      }
    }
    return;
  }
  for (std::size_t i = 0; i < word.size();) {
    const auto lead = static_cast<unsigned char>(word[i]);
    const std::size_t len = std::min(utf8_length(lead), word.size() - i);
    const std::string_view ch = word.substr(i, len);
    i += len;
    std::int32_t id = -1;
    if (lead < 0x80 && ascii_indexed) {
      id = ascii_ids[lead];
    } else if (auto it = vocab.find(ch); it != vocab.end()) {
      id = it->second;
    }
    if (id >= 0) {
      ids.push_back(id);
      last_unk = false;
      continue;
    }
    bool all = byte_fallback;
    for (unsigned char b : ch) all = all && fallback_ids[b] >= 0;
    if (all) {
      for (unsigned char b : ch) ids.push_back(fallback_ids[b]);
      last_unk = false;
    } else {
      unknown();
    }
  }
}

void BpeModel::index_ascii() {
  for (unsigned c = 0; c < 128; ++c) {
    const char ch = static_cast<char>(c);
    const auto it = vocab.find(std::string_view(&ch, 1));
    ascii_ids[c] = it == vocab.end() ? -1 : it->second;
  }
  ascii_indexed = true;
}

void BpeModel::encode_word_uncached(std::string_view word, std::vector<std::int32_t>& out) const {
  if (ignore_merges) {
    if (auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<std::int32_t> ids;
  ids.reserve(word.size());
  initial_symbols(word, ids);
  if (ids.size() <= 64) {
    merge_short(merges, ids);
  } else {
    merge_long(merges, ids);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

void BpeModel::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() > WordCache::kMaxWord) {
    encode_word_uncached(word, out);
    return;
  }
  WordCache& cache = cache_for(instance_);
  const std::uint64_t h = hash_bytes(word) | 1;
  std::uint32_t n = 0;
  if (const auto* ids = cache.find(word, h, n)) {
    out.insert(out.end(), ids, ids + n);
    return;
  }
  const std::size_t start = out.size();
  encode_word_uncached(word, out);
  cache.insert(word, h, out.data() + start, out.size() - start);
}

}  // namespace dlm::data::tok
