// The charsmap blob: <uint32 little-endian trie size><Darts-clone double array><replacements>. A
// Darts-clone unit is a uint32: bit 8 says the node has a leaf, bits 0-7 (and bit 31 for a leaf
// unit) are the label, the offset is (u >> 10) << ((u & 0x200) >> 6), and a leaf unit's value is
// u & 0x7FFFFFFF. Moving from node p by byte c goes to p ^ offset(p) ^ c, which must carry label c.
#include "sentencepiece_normalizer.h"

#include <algorithm>
#include <cstring>

namespace dlm::data::tok {
namespace {

using Type = SentencePieceModel::PieceType;

constexpr std::string_view kEscapedSpace = "\xE2\x96\x81";
// Normalizer::kMaxTrieResultsSize: the rules found past this many prefixes are not looked at.
constexpr std::size_t kMaxRules = 32;

// sentencepiece's OneCharLen: the length a lead byte announces, 1 for a continuation byte.
std::size_t one_char_len(unsigned char b) { return "\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[b >> 4]; }

bool has_leaf(std::uint32_t u) { return ((u >> 8) & 1) != 0; }
std::uint32_t leaf_value(std::uint32_t u) { return u & 0x7FFFFFFFu; }
std::uint32_t label(std::uint32_t u) { return u & (0x80000000u | 0xFFu); }
std::uint32_t offset(std::uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

std::uint32_t trie_size(const std::string& blob) {
  std::uint32_t n;
  std::memcpy(&n, blob.data(), 4);
  return n;
}

}  // namespace

std::optional<std::string> SentencePieceNormalizer::unsupported(const SentencePieceModel& m) {
  for (std::size_t i = 0; i < m.pieces.size(); ++i)
    if (m.pieces[i].piece.find('\0') != std::string::npos)
      return "piece " + std::to_string(i) + " holds a NUL byte";
  return charsmap_error(m);
}

std::optional<std::string> SentencePieceNormalizer::charsmap_error(const SentencePieceModel& m) {
  const std::string& blob = m.normalizer.precompiled_charsmap;
  if (blob.empty()) return std::nullopt;
  const std::string what = "normalizer \"" + m.normalizer.name + "\": the precompiled charsmap ";
  // DecodePrecompiledCharsMap's checks: a trie of whole 1024-byte blocks, then NUL-terminated text.
  const std::size_t trie = blob.size() > 4 ? trie_size(blob) : 0;
  if (trie < 1024 || trie % 1024 != 0 || trie >= blob.size() - 4 || blob.back() != '\0')
    return what + "is malformed (sizes)";
  // Every step the trie allows stays inside it, and every rule's value points into the text.
  const std::size_t n = trie / 4, text = blob.size() - 4 - trie;
  for (std::size_t p = 0; p < n; ++p) {
    std::uint32_t u;
    std::memcpy(&u, blob.data() + 4 + 4 * p, 4);
    if ((u & 0x80000000u) != 0) continue;  // a value unit, checked from its node
    const std::size_t q = p ^ offset(u);
    if ((q | 0xFF) >= n) return what + "leads outside its trie at unit " + std::to_string(p);
    if (!has_leaf(u)) continue;
    std::uint32_t v;
    std::memcpy(&v, blob.data() + 4 + 4 * q, 4);
    if (leaf_value(v) >= text) return what + "points outside its text at unit " + std::to_string(q);
  }
  return std::nullopt;
}

SentencePieceNormalizer::SentencePieceNormalizer(const SentencePieceModel& m)
    : charsmap_(m.normalizer.precompiled_charsmap),
      add_dummy_prefix_(m.normalizer.add_dummy_prefix),
      remove_extra_(m.normalizer.remove_extra_whitespaces),
      escape_(m.normalizer.escape_whitespaces),
      suffix_(m.treat_whitespace_as_suffix),
      space_(m.normalizer.escape_whitespaces ? kEscapedSpace : std::string_view(" ")) {
  if (!charsmap_.empty()) {
    const std::uint32_t bytes = trie_size(charsmap_);
    unit_store_.resize(bytes / 4);
    std::memcpy(unit_store_.data(), charsmap_.data() + 4, unit_store_.size() * 4);
    units_ = unit_store_.data();
    replacements_ = std::string_view(charsmap_).substr(4 + std::size_t{bytes});
  }
  for (const auto& p : m.pieces)
    if (p.type == Type::kUserDefined) {
      user_[static_cast<unsigned char>(p.piece[0])].push_back(p.piece);
      user_first_[static_cast<unsigned char>(p.piece[0])] = true;
    }
  for (auto& list : user_) {
    std::sort(list.begin(), list.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    list.erase(std::unique(list.begin(), list.end()), list.end());
  }
  // An ASCII byte's own rule (or the byte itself) is all that applies when its trie node has no
  // child (ascii_simple_), or no ASCII child and an ASCII byte or the end follows (ascii_copy_,
  // ascii_space_): NFKC's rules for a letter and a combining mark start with the letter. Where a
  // user-defined piece starts with the byte, that holds only where none of them starts (user_at).
  static const std::string kAscii = [] {
    std::string a(128, '\0');
    for (unsigned c = 0; c < 128; ++c) a[c] = static_cast<char>(c);
    return a;
  }();
  const std::size_t n = unit_store_.size();
  auto has_child = [&](std::size_t pos, unsigned below) {
    for (unsigned d = 1; d < below; ++d)
      if ((pos ^ d) < n && label(units_[pos ^ d]) == d) return true;
    return false;
  };
  for (unsigned c = 0; c < 128; ++c) {
    std::string_view result = std::string_view(kAscii).substr(c, 1);
    bool any_child = false, ascii_child = false;
    if (units_ != nullptr) {
      std::size_t pos = offset(units_[0]) ^ c;
      if (pos < n && label(units_[pos]) == c) {
        const bool leaf = has_leaf(units_[pos]);
        pos ^= offset(units_[pos]);
        any_child = has_child(pos, 256);
        ascii_child = has_child(pos, 128);
        if (leaf && pos < n && leaf_value(units_[pos]) < replacements_.size())
          result = replacement(leaf_value(units_[pos]));
      }
    }
    if (ascii_child) continue;
    ascii_[c] = result;
    ascii_simple_[c] = !any_child;
    ascii_copy_[c] = c != ' ' && result.size() == 1 && static_cast<unsigned char>(result[0]) == c;
    ascii_space_[c] = result == " ";
  }
}

std::size_t SentencePieceNormalizer::user_at(std::string_view s) const {
  for (const auto& u : user_[static_cast<unsigned char>(s[0])])
    if (s.size() >= u.size() && s.compare(0, u.size(), u) == 0) return u.size();
  return 0;
}

std::string_view SentencePieceNormalizer::replacement(std::uint32_t value) const {
  return replacements_.substr(value, replacements_.find('\0', value) - value);  // the text ends with NUL
}

std::size_t SentencePieceNormalizer::charsmap_match(std::string_view s, std::uint32_t& value) const {
  if (units_ == nullptr) return 0;
  const std::size_t n = unit_store_.size();
  std::size_t pos = offset(units_[0]);
  std::size_t longest = 0, rules = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    pos ^= c;
    if (pos >= n) break;
    const std::uint32_t u = units_[pos];
    if (label(u) != c) break;
    pos ^= offset(u);
    if (!has_leaf(u)) continue;
    if (pos >= n) break;
    longest = i + 1;
    value = leaf_value(units_[pos]);
    if (++rules == kMaxRules) break;
  }
  // A rule whose replacement lies outside the text is no rule (the character is kept).
  return value < replacements_.size() ? longest : 0;
}

std::pair<std::string_view, std::size_t> SentencePieceNormalizer::prefix(std::string_view s) const {
  const auto b = static_cast<unsigned char>(s[0]);
  if (const std::size_t len = user_first_[b] ? user_at(s) : 0; len != 0) return {s.substr(0, len), len};
  if (b < 0x80 && ascii_simple_[b]) return {ascii_[b], 1};
  std::uint32_t value = 0;
  if (const std::size_t len = charsmap_match(s, value); len != 0) return {replacement(value), len};
  // Valid UTF-8 in, so the character is whole.
  return {s.substr(0, std::min(one_char_len(b), s.size())), std::min(one_char_len(b), s.size())};
}

void SentencePieceNormalizer::normalize(std::string_view text, std::string& out) const {
  out.clear();
  std::size_t i = 0;
  if (remove_extra_)
    while (i < text.size()) {
      const auto [rep, len] = prefix(text.substr(i));
      if (rep != " ") break;
      i += len;
    }
  if (i == text.size()) return;
  out.reserve((text.size() - i) * 3 + 8);
  if (!suffix_ && add_dummy_prefix_) out += space_;
  bool prev_space = remove_extra_;
  while (i < text.size()) {
    // A run of ASCII bytes that stay as they are and are no space, each followed by ASCII or the end.
    auto ascii_next = [&](std::size_t k) { return k + 1 == text.size() || static_cast<unsigned char>(text[k + 1]) < 0x80; };
    std::size_t j = i;
    auto user_here = [&](std::size_t k) {
      return user_first_[static_cast<unsigned char>(text[k])] && user_at(text.substr(k)) != 0;
    };
    while (j < text.size() && ascii_copy(text[j]) && ascii_next(j) && !user_here(j)) ++j;
    if (j > i) {
      out.append(text.data() + i, j - i);
      prev_space = false;
      i = j;
      continue;
    }
    if (ascii_space_[static_cast<unsigned char>(text[i])] && ascii_next(i) && !user_here(i)) {  // a replacement " "
      if (!prev_space) out += space_;
      prev_space = remove_extra_;
      ++i;
      continue;
    }
    auto [rep, len] = prefix(text.substr(i));
    if (prev_space)
      while (!rep.empty() && rep[0] == ' ') rep.remove_prefix(1);
    if (!rep.empty()) {
      for (const char ch : rep) {
        if (ch == ' ' && escape_) out += kEscapedSpace;
        else out += ch;
      }
      prev_space = rep.back() == ' ';
    }
    i += len;
    if (!remove_extra_) prev_space = false;
  }
  if (remove_extra_)
    while (out.size() >= space_.size() && out.compare(out.size() - space_.size(), space_.size(), space_) == 0)
      out.resize(out.size() - space_.size());
  if (suffix_ && add_dummy_prefix_) out += space_;
}

}  // namespace dlm::data::tok
