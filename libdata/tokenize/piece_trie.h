// A double-array trie over byte strings (the pieces of a SentencePiece model, each with its id and
// score), for walking every piece that starts at a position of the text, shortest first, one array
// step per byte.
//
// Node n's child by byte c (1..255) is base[n] + c when check[base[n] + c] == n; the root is node 0.
// The arrays reach 256 past the largest base, so a step needs no bounds check. Keys must not hold
// NUL (a SentencePiece model's keys cannot: its own trie stops at NUL).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dlm::data::tok {

class PieceTrie {
 public:
  // A slot of the double array, with the key that ends at this node (value -1: none).
  struct Node {
    std::int32_t base = 0;
    std::int32_t check = -1;
    std::int32_t value = -1;
    float weight = 0;
  };
  struct Key {
    std::string text;
    std::int32_t value;  // >= 0
    float weight;
    bool operator<(const Key& o) const { return text < o.text; }
  };
  // `keys`: distinct non-empty strings, in any order.
  explicit PieceTrie(std::vector<Key> keys);
  PieceTrie() = default;

  // The node reached from `node` by byte `c`, or -1. Byte 0 leads nowhere.
  std::int32_t step(std::int32_t node, unsigned char c) const {
    const std::int32_t next = nodes_[static_cast<std::size_t>(node)].base + c;
    return nodes_[static_cast<std::size_t>(next)].check == node ? next : -1;
  }
  const Node& node(std::int32_t n) const { return nodes_[static_cast<std::size_t>(n)]; }

 private:
  using Keys = std::vector<Key>;
  void build(const Keys& keys, std::size_t lo, std::size_t hi, std::size_t depth, std::int32_t node);
  std::int32_t place(const std::vector<unsigned char>& labels);
  void grow(std::size_t size);

  std::vector<Node> nodes_ = std::vector<Node>(257);
  std::size_t next_free_ = 1;  // no free slot below this one
};

}  // namespace dlm::data::tok
