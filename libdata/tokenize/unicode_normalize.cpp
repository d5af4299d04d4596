#include "unicode_normalize.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>

#include "dlm/common/error.h"
#include "text.h"

namespace dlm::data::tok {
namespace {

struct CodePointRange {
  char32_t first, last;
};

constexpr CodePointRange kUnknownToReference[] = {
#include "normalizer_unknown.inc"
};

bool unknown_to_reference(char32_t cp) {
  if (cp < kUnknownToReference[0].first) return false;
  const auto* it = std::upper_bound(std::begin(kUnknownToReference), std::end(kUnknownToReference), cp,
                                    [](char32_t c, const CodePointRange& r) { return c < r.first; });
  return it != std::begin(kUnknownToReference) && cp <= (it - 1)->last;
}

void append_normalized(std::string& out, std::string_view s, UnicodeForm form) {
  if (s.empty()) return;
  int options = UTF8PROC_STABLE;
  if (form == UnicodeForm::kNfc || form == UnicodeForm::kNfkc) options |= UTF8PROC_COMPOSE;
  if (form == UnicodeForm::kNfd || form == UnicodeForm::kNfkd) options |= UTF8PROC_DECOMPOSE;
  if (form == UnicodeForm::kNfkc || form == UnicodeForm::kNfkd) options |= UTF8PROC_COMPAT;
  utf8proc_uint8_t* mapped = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &mapped, static_cast<utf8proc_option_t>(options));
  if (n < 0) fail(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(mapped), static_cast<std::size_t>(n));
  std::free(mapped);
}

}  // namespace

std::string unicode_normalize(std::string_view text, UnicodeForm form) {
  // Code points below U+0300 are stable under NFC, ASCII under every form: skip the library then.
  const unsigned char stable_below = form == UnicodeForm::kNfc ? 0xCC : 0x80;
  if (std::all_of(text.begin(), text.end(), [&](char c) { return static_cast<unsigned char>(c) < stable_below; }))
    return std::string(text);
  // A code point unknown to the reference is a starter to it: nothing reorders or composes across
  // it, so the runs between such code points normalize independently and it is kept as it is.
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  std::size_t run = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t at = i;
    if (static_cast<unsigned char>(text[i]) < 0xDF) {  // below U+07C0: never unknown
      i += utf8_length(static_cast<unsigned char>(text[i]));
      continue;
    }
    const char32_t cp = next_code_point(text, i);
    if (!unknown_to_reference(cp)) continue;
    append_normalized(out, text.substr(run, at - run), form);
    out.append(text.substr(at, i - at));
    run = i;
  }
  append_normalized(out, text.substr(run), form);
  return out;
}

}  // namespace dlm::data::tok
