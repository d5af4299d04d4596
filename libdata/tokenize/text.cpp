#include "text.h"

namespace dlm::data::tok {
namespace {

// The continuation-byte range allowed right after lead byte `lead` (Unicode table 3-7); later
// continuation bytes are always 0x80..0xBF. Returns the sequence length, 0 for an invalid lead.
int sequence_rule(unsigned char lead, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead == 0xE0) { lo = 0xA0; return 3; }
  if (lead == 0xED) { hi = 0x9F; return 3; }
  if (lead >= 0xE1 && lead <= 0xEF) return 3;
  if (lead == 0xF0) { lo = 0x90; return 4; }
  if (lead >= 0xF1 && lead <= 0xF3) return 4;
  if (lead == 0xF4) { hi = 0x8F; return 4; }
  return 0;
}

}  // namespace

int utf8_sequence(std::string_view s, std::size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  if (lead < 0x80) return 1;
  unsigned char lo, hi;
  const int n = sequence_rule(lead, lo, hi);
  if (n == 0) return -1;
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -k;
    const auto c = static_cast<unsigned char>(s[i + k]);
    if (c < lo || c > hi) return -k;
    lo = 0x80;
    hi = 0xBF;
  }
  return n;
}

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    // Eight ASCII bytes at a time: most text is mostly ASCII.
    while (i + 8 <= s.size()) {
      std::uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const int n = utf8_sequence(s, i);
    if (n < 0) return false;
    i += static_cast<std::size_t>(n);
  }
  return true;
}

std::string repair_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  std::size_t i = 0;
  while (i < s.size()) {
    const int n = utf8_sequence(s, i);
    if (n > 0) {
      out.append(s.substr(i, static_cast<std::size_t>(n)));
      i += static_cast<std::size_t>(n);
    } else {
      out += "\xEF\xBF\xBD";
      i += static_cast<std::size_t>(-n);
    }
  }
  return out;
}

char32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const std::size_t n = utf8_length(b);
  if (n == 1 || i + n > s.size()) {
    ++i;
    return b;
  }
  char32_t cp = b & (0xFF >> (n + 1));
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

const std::array<char32_t, 256>& byte_to_char() {
  // Printable Latin-1 bytes stand for themselves; the other 68 take the code points from U+0100 on.
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

int char_to_byte(char32_t cp) {
  static const std::array<std::int16_t, 512> inverse = [] {
    std::array<std::int16_t, 512> t{};
    t.fill(-1);
    const auto& fwd = byte_to_char();
    for (int b = 0; b < 256; ++b) t[fwd[b]] = static_cast<std::int16_t>(b);
    return t;
  }();
  return cp < 512 ? inverse[cp] : -1;
}

}  // namespace dlm::data::tok
