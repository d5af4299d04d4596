// A double-array trie over byte strings (the pieces of a SentencePiece model), for walking every
// piece that starts at a position of the text, shortest first, one array step per byte.
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
  struct Node {
    std::int32_t base = 0;
    std::int32_t check = -1;
  };
  // `keys`: distinct non-empty strings and their values (>= 0), in any order.
  explicit PieceTrie(std::vector<std::pair<std::string, std::int32_t>> keys);
  PieceTrie() = default;

  // The node reached from `node` by byte `c`, or -1.
  std::int32_t step(std::int32_t node, unsigned char c) const {
    const std::int32_t next = nodes_[static_cast<std::size_t>(node)].base + c;
    return nodes_[static_cast<std::size_t>(next)].check == node ? next : -1;
  }
  // The value of the key that ends at `node`, or -1.
  std::int32_t value(std::int32_t node) const { return values_[static_cast<std::size_t>(node)]; }
  std::size_t size() const { return nodes_.size(); }

 private:
  using Keys = std::vector<std::pair<std::string, std::int32_t>>;
  void build(const Keys& keys, std::size_t lo, std::size_t hi, std::size_t depth, std::int32_t node);
  std::int32_t place(const std::vector<unsigned char>& labels);
  void grow(std::size_t size);

  std::vector<Node> nodes_ = std::vector<Node>(257);
  std::vector<std::int32_t> values_ = std::vector<std::int32_t>(257, -1);
  std::size_t next_free_ = 1;  // no free slot below this one
};

}  // namespace dlm::data::tok
