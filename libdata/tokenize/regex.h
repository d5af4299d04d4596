// A pre-tokenizer regex: PCRE2 with JIT, matched the way `tokenizers` (Oniguruma) and `tiktoken`
// (fancy-regex) match their patterns, so the same pieces come out.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dlm::data::tok {

struct Span {
  std::size_t begin, end;
};

class Regex {
 public:
  // `where` names the file and field for the error when the pattern does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends every non-overlapping, non-empty match of valid UTF-8 `text`, left to right.
  void find_all(std::string_view text, std::vector<Span>& out) const;
  // The same from byte `at` on, stopping after `max` matches: returns where to go on (text.size() when
  // done). A document of 1 GB is ~250M words; callers take them a chunk at a time.
  std::size_t find_some(std::string_view text, std::size_t at, std::vector<Span>& out, std::size_t max) const;

  // The pattern as given, and as handed to PCRE2 (see translate() in regex.cpp).
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8
};

// `pattern` with \s and \S widened to Unicode's White_Space: PCRE2's \s under UCP omits U+0085,
// which Oniguruma's and Rust's \s include.
std::string translate_pattern(const std::string& pattern);

}  // namespace dlm::data::tok
