// UTF-8 helpers shared by the tokenizers: validation and repair, code points, Unicode white space,
// and GPT-2's byte <-> printable-character table.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace dlm::data::tok {

// True when `text` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool valid_utf8(std::string_view text);

// Replaces every ill-formed subsequence by U+FFFD exactly as Python's bytes.decode("utf-8", "replace")
// does (one U+FFFD per maximal subpart), so the ids equal the reference's for that Python string.
std::string repair_utf8(std::string_view text);

// The length of the well-formed sequence at `text[i]`, or minus the length of the maximal ill-formed
// subpart there.
int utf8_sequence(std::string_view text, std::size_t i);

// Length of the UTF-8 sequence that starts with byte `b` (1 for a stray byte).
inline std::size_t utf8_length(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}
// Decodes the code point at `text[i]` of valid UTF-8 and advances `i`.
char32_t next_code_point(std::string_view text, std::size_t& i);
void append_utf8(std::string& out, char32_t cp);

// Unicode's White_Space property: Rust's char::is_whitespace, which `tokenizers` uses.
bool is_unicode_whitespace(char32_t cp);

// GPT-2's reversible map from the 256 byte values to printable characters (bytes_to_unicode).
const std::array<char32_t, 256>& byte_to_char();
// The byte a byte-level character stands for, or -1 when `cp` is not one of the 256.
int char_to_byte(char32_t cp);

}  // namespace dlm::data::tok
