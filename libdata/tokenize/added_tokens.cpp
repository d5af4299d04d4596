#include "added_tokens.h"

#include <algorithm>
#include <cstring>

#include "text.h"

namespace dlm::data::tok {
namespace {

// Unicode white space ending just before `end` (lstrip) or starting at `begin` (rstrip).
std::size_t whitespace_before(std::string_view s, std::size_t end) {
  std::size_t i = end;
  while (i > 0) {
    std::size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
    std::size_t k = j;
    if (!is_unicode_whitespace(next_code_point(s, k))) break;
    i = j;
  }
  return i;
}

std::size_t whitespace_after(std::string_view s, std::size_t begin) {
  std::size_t i = begin;
  while (i < s.size()) {
    std::size_t k = i;
    if (!is_unicode_whitespace(next_code_point(s, k))) break;
    i = k;
  }
  return i;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::erase_if(tokens_, [](const AddedToken& t) { return t.content.empty(); });
  std::stable_sort(tokens_.begin(), tokens_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    const auto b = static_cast<unsigned char>(tokens_[i].content[0]);
    by_first_[b].push_back(static_cast<std::uint16_t>(i));
    first_[b >> 6] |= std::uint64_t{1} << (b & 63);
  }
}

int AddedTokenMatcher::match_at(std::string_view text, std::size_t i) const {
  const auto b = static_cast<unsigned char>(text[i]);
  for (std::uint16_t k : by_first_[b]) {
    const std::string& c = tokens_[k].content;
    if (c.size() <= text.size() - i && std::memcmp(text.data() + i, c.data(), c.size()) == 0) return k;
  }
  return -1;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Piece>& out) const {
  std::size_t plain = 0;  // start of the text not yet emitted
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (!(first_[b >> 6] >> (b & 63) & 1)) {
      ++i;
      continue;
    }
    const int k = match_at(text, i);
    if (k < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = tokens_[static_cast<std::size_t>(k)];
    std::size_t begin = i, end = i + t.content.size();
    if (t.lstrip) begin = std::max(plain, whitespace_before(text, begin));
    if (t.rstrip) end = whitespace_after(text, end);
    if (begin > plain) out.push_back({text.substr(plain, begin - plain), -1});
    out.push_back({{}, t.id});
    plain = i = end;
  }
  if (plain < text.size()) out.push_back({text.substr(plain), -1});
}

}  // namespace dlm::data::tok
