// A double-array trie over byte strings (the pieces of a SentencePiece model, each with its id and
// score), for walking every piece that starts at a position of the text, shortest first, one array
// step per byte.
//
// Node n's child by byte c is the slot base(n) + c when that slot's label is c. Every node that has
// children has a base of its own, so a slot with label c belongs to exactly one parent; nodes
// without children share a block of free slots. The root is slot 0. The array reaches 256 past the
// largest base, so a step needs no bounds check. Keys must not hold NUL (a SentencePiece model's
// keys cannot), so a NUL byte after the text ends every walk. A slot is 8 bytes and a walk reads
// one per byte; a key's weight is kept by its slot (beside the array), read only where a key ends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlm::data::tok {

class PieceTrie {
 public:
  struct Key {
    std::string text;
    std::int32_t value;  // 0 <= value < 2^22
    float weight;
    bool operator<(const Key& o) const { return text < o.text; }
  };
  // `keys`: distinct non-empty strings, in any order.
  explicit PieceTrie(std::vector<Key> keys);
  PieceTrie() = default;

  static constexpr std::int32_t kMaxValue = (1 << 22) - 1;

  // Calls on_key(length, value, weight) for each key that is a prefix of `text`, shortest first.
  // `text` must end with a NUL byte (no key holds one), where the walk stops at the latest.
  template <class OnKey>
  void prefixes(const unsigned char* text, OnKey&& on_key) const {
    // The first three steps written out: most walks end within them, and the branch where a walk
    // ends is then predicted apart for each of them.
    std::uint32_t base = root_base_;
    if (!step(text, 1, base, on_key) || !step(text, 2, base, on_key) || !step(text, 3, base, on_key)) return;
    for (std::size_t length = 4; step(text, length, base, on_key);) ++length;
  }

 private:
  static constexpr std::uint32_t kKeyBit = 0x80000000u;
  static constexpr std::uint32_t kLabelMask = 0x1FFu, kFree = 0x1FFu;  // no byte is 0x1FF
  struct Slot {
    // The base alone, so that a step's next slot is one add away from the slot read.
    std::uint32_t base = 0;
    std::uint32_t tail = kFree;  // bits 0-8: the byte that leads here; 9-30: the key's value; 31: a key ends here
  };
  using Keys = std::vector<Key>;
  // Takes the walk's step to `length` bytes from the node whose base is `base`: false where no key
  // goes on with text[length - 1], else on_key where a key ends and `base` moved on.
  template <class OnKey>
  bool step(const unsigned char* text, std::size_t length, std::uint32_t& base, OnKey& on_key) const {
    const unsigned c = text[length - 1];
    const Slot s = nodes_[base + c];
    if ((s.tail & kLabelMask) != c) return false;
    if ((s.tail & kKeyBit) != 0) on_key(length, static_cast<std::int32_t>((s.tail >> 9) & kMaxValue), weights_[base + c]);
    base = s.base;
    return true;
  }
  void build(const Keys& keys);
  std::uint32_t place(const std::vector<unsigned char>& labels);
  std::size_t free_from(std::size_t pos);  // the first free slot at or after `pos`
  void grow(std::size_t size);

  std::vector<Slot> nodes_ = std::vector<Slot>(257);
  std::uint32_t root_base_ = 0;  // nodes_[0].base
  std::vector<bool> base_used_ = std::vector<bool>(257);
  std::vector<float> weights_;       // by slot: the weight of the key that ends there (by value while building)
  std::vector<std::uint32_t> skip_;  // for a taken slot: a later slot to look at (building only)
  std::size_t highest_ = 0;          // the highest slot taken so far (building only)
};

}  // namespace dlm::data::tok
