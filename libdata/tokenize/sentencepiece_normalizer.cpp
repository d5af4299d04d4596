// The charsmap blob: <uint32 little-endian trie size><Darts-clone double array><replacements>. A
// Darts-clone unit is a uint32: bit 8 says the node has a leaf, bits 0-7 (and bit 31 for a leaf
// unit) are the label, the offset is (u >> 10) << ((u & 0x200) >> 6), and a leaf unit's value is
// u & 0x7FFFFFFF. Moving from node p by byte c goes to p ^ offset(p) ^ c, which must carry label c.
#include "sentencepiece_normalizer.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "text.h"

namespace dlm::data::tok {
namespace {

using Type = SentencePieceModel::PieceType;

constexpr std::string_view kEscapedSpace = "\xE2\x96\x81";
// Normalizer::kMaxTrieResultsSize: the rules found past this many prefixes are not looked at.
constexpr std::size_t kMaxRules = 32;

// sentencepiece's OneCharLen: the length a lead byte announces, 1 for a continuation byte.
std::size_t one_char_len(unsigned char b) { return "\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[b >> 4]; }

// Whether s[i, i + len) is whole UTF-8 characters.
bool whole_chars(std::string_view s, std::size_t i, std::size_t len) {
  const std::size_t end = i + len;
  while (i < end) {
    const int m = utf8_sequence(s, i);
    if (m <= 0) return false;
    i += static_cast<std::size_t>(m);
  }
  return i == end;
}

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

std::optional<unsigned char> SentencePieceNormalizer::space_byte(const SentencePieceModel& m) {
  constexpr char kByte = '\xFF';
  for (const auto& p : m.pieces)
    if (p.piece.find(kByte) != std::string::npos) return std::nullopt;
  const std::string& blob = m.normalizer.precompiled_charsmap;
  if (!blob.empty() && blob.find(kByte, 4 + std::size_t{trie_size(blob)}) != std::string::npos) return std::nullopt;
  return static_cast<unsigned char>(kByte);
}

SentencePieceNormalizer::SentencePieceNormalizer(const SentencePieceModel& m, std::optional<unsigned char> space_byte)
    : charsmap_(m.normalizer.precompiled_charsmap),
      add_dummy_prefix_(m.normalizer.add_dummy_prefix),
      remove_extra_(m.normalizer.remove_extra_whitespaces),
      escape_(m.normalizer.escape_whitespaces),
      suffix_(m.treat_whitespace_as_suffix),
      space_(m.normalizer.escape_whitespaces ? kEscapedSpace : std::string_view(" ")),
      space_byte_(space_byte) {
  if (space_byte_ && escape_) space_ = std::string_view(reinterpret_cast<const char*>(&*space_byte_), 1);
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
  for (unsigned a = 0; a < 256; ++a)
    for (const auto& u : user_[a])
      for (unsigned b = 0; b < 256; ++b)
        if (u.size() == 1 || static_cast<unsigned char>(u[1]) == b) user_pair_[a << 2 | b >> 6] |= std::uint64_t{1} << (b & 63);
  // rule_pair_: the charsmap has a rule that is a alone or starts with a b.
  for (unsigned a = 0x80; a < 256 && units_ != nullptr; ++a) {
    const std::size_t n = unit_store_.size();
    std::size_t pos = offset(units_[0]) ^ a;
    if (pos >= n || label(units_[pos]) != a) continue;
    const bool alone = has_leaf(units_[pos]);
    pos ^= offset(units_[pos]);
    for (unsigned b = 0; b < 256; ++b)
      if (alone || ((pos ^ b) < n && label(units_[pos ^ b]) == b)) rule_pair_[a << 2 | b >> 6] |= std::uint64_t{1} << (b & 63);
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
    unsigned char k = !any_child ? kAnyNext : 0;
    if (c != ' ' && result.size() == 1 && static_cast<unsigned char>(result[0]) == c) k |= kCopy;
    // A space is one byte only where not escaped, or escaped to space_byte_.
    if (result == " " && space_.size() == 1) k |= kSpace;
    if ((k & (kCopy | kSpace)) != 0) k |= user_first_[c] ? kUser : kPlain;
    plain_[c] = k;
    any_user_ |= (k & kUser) != 0;
    plain_byte_[c] = (k & kSpace) != 0 ? static_cast<unsigned char>(space_[0]) : static_cast<unsigned char>(c);
  }
  // Printable ASCII in eight-byte blocks: where each byte is kept (a space: one space), and at most
  // kBlockUsers of them may start a user-defined piece.
  printable_plain_ = (plain_[' '] & kSpace) != 0;
  for (unsigned c = 0x20; c < 0x7F; ++c) {
    printable_plain_ &= (plain_[c] & (kPlain | kUser)) != 0 && (c == ' ' || (plain_[c] & kCopy) != 0);
    if ((plain_[c] & kUser) == 0) continue;
    for (const auto& u : user_[c]) {
      // Its first two bytes (or the first alone), each repeated in all eight bytes.
      const std::uint64_t second = u.size() > 1 ? static_cast<unsigned char>(u[1]) * 0x0101010101010101u : 0;
      const BlockUser b{c * 0x0101010101010101u, second, u.size() == 1};
      if (std::find(block_user_.begin(), block_user_.begin() + static_cast<std::ptrdiff_t>(block_users_), b) !=
          block_user_.begin() + static_cast<std::ptrdiff_t>(block_users_))
        continue;
      if (block_users_ == kBlockUsers) printable_plain_ = false;
      else block_user_[block_users_++] = b;
    }
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

std::size_t SentencePieceNormalizer::emit(std::string_view rep, std::string& buf, std::size_t w) const {
  if (buf.size() < w + 3 * rep.size() + 1) buf.resize(std::max(2 * buf.size(), w + 3 * rep.size() + 1));
  char* o = buf.data();
  for (const char ch : rep) {
    if (ch == ' ' && escape_) {
      std::memcpy(o + w, space_.data(), space_.size());
      w += space_.size();
    } else {
      o[w++] = ch;
      // U+2581 from the text, a rule or a user-defined piece: the same as an escaped space.
      if (space_byte_ && ch == kEscapedSpace[2] && w >= 3 && std::memcmp(o + w - 3, kEscapedSpace.data(), 3) == 0) {
        w -= 3;
        o[w++] = static_cast<char>(*space_byte_);
      }
    }
  }
  return w;
}

// On a cache line, as the unigram lattice's loops (sentencepiece_unigram.cpp says why).
[[gnu::aligned(64)]] std::size_t SentencePieceNormalizer::normalize(std::string_view text, std::string& buf, bool check) const {
  const std::size_t n = text.size();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t i = 0, w = 0;
  if (remove_extra_)
    while (i < n) {
      const auto [rep, len] = prefix(text.substr(i));
      if (rep != " ") break;
      if (check && !whole_chars(text, i, len)) return kNotChecked;
      i += len;
    }
  // Room for every byte of the text as three, and the NUL; emit() grows it for longer results.
  if (buf.size() < 3 * (n - i) + 8) buf.resize(3 * (n - i) + 8);
  if (i == n) {
    buf[0] = '\0';
    return 0;
  }
  if (!suffix_ && add_dummy_prefix_) w = emit(" ", buf, w);
  bool prev_space = remove_extra_;
  while (i < n) {
    // Plain ASCII (kept, or one space), each followed by ASCII or the end; a space after a space
    // is dropped where remove_extra_ by not moving w past it.
    // Without a branch between letters and spaces: they alternate unpredictably.
    char* o = buf.data();
    const unsigned drop_repeats = remove_extra_;
    unsigned after_space = prev_space;
    auto plain = [&](unsigned b, unsigned k) {
      const unsigned space = (k / kSpace) & 1;
      o[w] = static_cast<char>(plain_byte_[b]);
      w += 1 - (space & after_space);
      after_space = space & drop_repeats;
    };
    // Not plain, unless kUser and no user-defined piece starts with these two bytes; or a rule may
    // go on with the next byte. One branch: letters and spaces alternate unpredictably. The pair
    // table is looked at only for a model where some kUser byte is there.
    const std::size_t last = n - 1;
    auto ok = [&](auto users, unsigned k) {
      unsigned yes = k / kPlain;
      if constexpr (decltype(users)::value) yes |= (k / kUser) & ~static_cast<unsigned>(user_pair(p[i], p[i + 1]));
      return (((yes & 1) == 0) | ((p[i + 1] >> 7) & ~(k / kAnyNext) & 1)) == 0;
    };
    auto run = [&](auto users) {
      if (printable_plain_) {
        for (;;) {
          // Eight bytes at a time: those before the first that is not printable ASCII or is a
          // space after a space are kept or written as the one space byte.
          while (i + 9 <= n) {
            constexpr std::uint64_t kOnes = 0x0101010101010101u, kHigh = kOnes * 0x80, kLow = kOnes * 0x7F;
            std::uint64_t x;
            std::memcpy(&x, p + i, 8);
            const std::uint64_t unprintable = ((x - kOnes * 0x20) & ~x & kHigh) | (((x + kOnes) | x) & kHigh);
            const std::uint64_t t = x ^ (kOnes * 0x20);
            const std::uint64_t spaces = ~(((t & kLow) + kLow) | t | kLow);  // 0x80 in each space byte
            const std::uint64_t mask = (spaces >> 7) * 0xFF;
            const std::uint64_t y = (x & ~mask) | (mask & (kOnes * static_cast<unsigned char>(space_[0])));
            std::memcpy(o + w, &y, 8);  // room: a byte for each byte of the text, and 8
            std::uint64_t bad = unprintable | (spaces & ((spaces << 8) | (std::uint64_t{after_space} << 7)));
            if constexpr (decltype(users)::value) {
              // Not plain where a user-defined piece may start: its first two bytes are here.
              auto equal = [&](std::uint64_t v, std::uint64_t rep) {
                const std::uint64_t e = v ^ rep;
                return ~(((e & kLow) + kLow) | e | kLow);
              };
              const std::uint64_t next = x >> 8 | std::uint64_t{p[i + 8]} << 56;  // the byte after each
              for (std::size_t u = 0; u < block_users_; ++u) {
                const BlockUser& b = block_user_[u];
                bad |= equal(x, b.first) & (b.alone ? ~std::uint64_t{0} : equal(next, b.second));
              }
            }
            std::size_t f = bad != 0 ? static_cast<std::size_t>(__builtin_ctzll(bad)) / 8 : 8;
            if (p[i + f] >= 0x80 && f > 0) --f;  // the byte before a non-ASCII one: one by one
            if (f > 0) after_space = static_cast<unsigned>(spaces >> (8 * f - 1)) & 1 & drop_repeats;
            w += f;
            i += f;
            if (f < 8) break;
          }
          // The byte that stopped the block, one by one, and the spaces that follow a space.
          if (i >= last) return;
          if (const unsigned k = plain_[p[i]]; ok(users, k)) plain(p[i], k);
          else return;
          ++i;
          while (after_space != 0 && p[i] == ' ' && i < last && ok(users, plain_[' '])) ++i;
        }
      }
      for (; i < last; ++i) {
        const unsigned k = plain_[p[i]];
        if (!ok(users, k)) return;
        plain(p[i], k);
      }
    };
    if (any_user_) run(std::true_type{});
    else run(std::false_type{});
    prev_space = after_space;
    // Characters from 0x80 on that no rule and no user-defined piece starts with (rule_pair_): kept
    // as they are (U+2581 as space_byte_), checked as UTF-8 and not looked up in the charsmap.
    if (const std::size_t from = i; p[i] >= 0x80) {
      while (i + 1 < n && p[i] >= 0x80 && !user_first_[p[i]] && !rule_pair(p[i], p[i + 1])) {
        const int m = utf8_sequence(text, i);
        if (m <= 0) break;
        if (space_byte_ && m == 3 && std::memcmp(p + i, kEscapedSpace.data(), 3) == 0) {
          o[w++] = static_cast<char>(*space_byte_);
        } else {
          const auto len = static_cast<std::size_t>(m);
          std::memcpy(o + w, p + i, i + 4 <= n ? 4 : len);  // room: a byte for each byte of the text, and 8
          w += len;
        }
        i += static_cast<std::size_t>(m);
      }
      if (i != from) {
        prev_space = false;
        continue;
      }
    }
    // A user-defined piece, a rule, the last byte or a character kept as it is; every byte from
    // 0x80 on that the loop above leaves comes here.
    auto [rep, len] = prefix(text.substr(i));
    if (check && !whole_chars(text, i, len)) return kNotChecked;
    if (prev_space)
      while (!rep.empty() && rep[0] == ' ') rep.remove_prefix(1);
    if (!rep.empty()) {
      w = emit(rep, buf, w);
      prev_space = rep.back() == ' ';
    }
    i += len;
    if (!remove_extra_) prev_space = false;
    if (buf.size() < w + 3 * (n - i) + 8) buf.resize(std::max(2 * buf.size(), w + 3 * (n - i) + 8));
  }
  if (remove_extra_)
    while (w >= space_.size() && std::memcmp(buf.data() + w - space_.size(), space_.data(), space_.size()) == 0)
      w -= space_.size();
  if (suffix_ && add_dummy_prefix_) w = emit(" ", buf, w);
  buf[w] = '\0';
  return w;
}

}  // namespace dlm::data::tok
