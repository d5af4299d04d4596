// Built as Darts builds its double arrays: keys sorted, each node's children placed together at the
// first base where all their slots are free, then each child's subtree in turn.
#include "piece_trie.h"

#include <algorithm>

namespace dlm::data::tok {

PieceTrie::PieceTrie(Keys keys) {
  std::sort(keys.begin(), keys.end());
  nodes_[0].check = -2;  // the root's slot is taken (no child lands on 0: bases are >= 0, bytes >= 1)
  if (!keys.empty()) build(keys, 0, keys.size(), 0, 0);
  grow(nodes_.size());
}

void PieceTrie::grow(std::size_t size) {
  if (nodes_.size() < size) {
    nodes_.resize(std::max(size, nodes_.size() * 2));
  }
}

std::int32_t PieceTrie::place(const std::vector<unsigned char>& labels) {
  std::size_t pos = std::max<std::size_t>(next_free_, std::size_t{labels[0]} + 1);
  const std::size_t from = pos;
  std::size_t taken = 0;
  for (;; ++pos) {
    grow(pos + 257);
    if (nodes_[pos].check != -1) {
      ++taken;
      continue;
    }
    const std::size_t base = pos - labels[0];
    bool fits = true;
    for (std::size_t k = 1; k < labels.size() && fits; ++k) fits = nodes_[base + labels[k]].check == -1;
    if (!fits) continue;
    // Darts' rule: a scanned stretch that is 95% taken is not scanned again.
    if (taken * 20 >= (pos - from + 1) * 19) next_free_ = pos;
    return static_cast<std::int32_t>(base);
  }
}

void PieceTrie::build(const Keys& keys, std::size_t lo, std::size_t hi, std::size_t depth, std::int32_t node) {
  if (keys[lo].text.size() == depth) {
    nodes_[static_cast<std::size_t>(node)].value = keys[lo].value;
    nodes_[static_cast<std::size_t>(node)].weight = keys[lo++].weight;
  }
  if (lo == hi) return;
  std::vector<unsigned char> labels;
  std::vector<std::size_t> starts;
  for (std::size_t i = lo; i < hi; ++i) {
    const auto c = static_cast<unsigned char>(keys[i].text[depth]);
    if (labels.empty() || labels.back() != c) {
      labels.push_back(c);
      starts.push_back(i);
    }
  }
  starts.push_back(hi);
  const std::int32_t base = place(labels);
  nodes_[static_cast<std::size_t>(node)].base = base;
  for (const unsigned char c : labels) nodes_[static_cast<std::size_t>(base) + c].check = node;
  grow(static_cast<std::size_t>(base) + 257);
  while (next_free_ < nodes_.size() && nodes_[next_free_].check != -1) ++next_free_;
  for (std::size_t k = 0; k < labels.size(); ++k)
    build(keys, starts[k], starts[k + 1], depth + 1, base + labels[k]);
}

}  // namespace dlm::data::tok
