#include "sentencepiece_bpe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "text.h"

namespace dlm::data::tok {
namespace {

using Type = SentencePieceModel::PieceType;

// libsentencepiece's pieces_ map: the strings the merge loop may produce. Control, unknown and byte
// pieces live in its reserved map and are only reached by id.
bool mergeable(Type t) { return t == Type::kNormal || t == Type::kUserDefined || t == Type::kUnused; }

std::size_t char_count(std::string_view s) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < s.size(); i += utf8_length(static_cast<unsigned char>(s[i]))) ++n;
  return n;
}

char32_t char_at(std::string_view s, std::size_t i) { return next_code_point(s, i); }

char32_t char_before(std::string_view s, std::size_t end) {
  std::size_t k = end - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return next_code_point(s, k);
}

std::string byte_piece(unsigned b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

std::string describe(std::size_t id, const std::string& piece) {
  return "piece " + std::to_string(id) + " \"" + piece + "\"";
}

}  // namespace

std::optional<std::string> SentencePieceBpe::unsupported(const SentencePieceModel& m) {
  using MT = SentencePieceModel::ModelType;
  if (m.model_type != MT::kBpe) return "a " + std::string(model_type_name(m.model_type)) + " model";
  if (!m.normalizer.precompiled_charsmap.empty())
    return "normalizer \"" + m.normalizer.name + "\" has a precompiled charsmap";
  std::unordered_set<std::string_view> pieces;
  std::unordered_map<std::string_view, Type> reserved;
  bool has_unk = false;
  for (std::size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    if (p.piece.empty()) return describe(i, p.piece) + " is empty";
    if (!valid_utf8(p.piece)) return "piece " + std::to_string(i) + " is not valid UTF-8";
    if (p.type == Type::kUnused) return "unused " + describe(i, p.piece) + " (libsentencepiece resegments those)";
    if (mergeable(p.type)) {
      if (std::isnan(p.score)) return describe(i, p.piece) + " has a NaN score";
      if (p.type == Type::kUserDefined && p.piece.find(' ') != std::string::npos)
        return "user-defined " + describe(i, p.piece) + " holds a space";
      pieces.insert(p.piece);
    } else {
      if (char_count(p.piece) == 1) return "control/unknown/byte " + describe(i, p.piece) + " is a single character";
      reserved.emplace(p.piece, p.type);
      has_unk = has_unk || p.type == Type::kUnknown;
    }
  }
  if (!has_unk) return "no unknown piece";
  for (std::size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    if (p.type != Type::kNormal) continue;
    for (std::size_t k = 0; k < p.piece.size();) {
      const std::size_t len = utf8_length(static_cast<unsigned char>(p.piece[k]));
      if (!pieces.count(std::string_view(p.piece).substr(k, len)))
        return describe(i, p.piece) + " holds a character that is no piece";
      k += len;
    }
  }
  if (m.byte_fallback) {
    for (unsigned b = 0; b < 256; ++b) {
      const auto it = reserved.find(byte_piece(b));
      if (it == reserved.end() || it->second != Type::kByte) return "byte_fallback without the byte piece " + byte_piece(b);
    }
  }
  return std::nullopt;
}

SentencePieceBpe::SentencePieceBpe(const SentencePieceModel& m)
    : normalizer_(m.normalizer), suffix_(m.treat_whitespace_as_suffix),
      space_(m.normalizer.escape_whitespaces ? "\xE2\x96\x81" : " ") {
  bpe_.symbols = BpeModel::Symbols::kChars;
  std::unordered_map<std::string, std::int32_t> reserved;
  std::vector<float> scores;
  for (std::size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    const auto id = static_cast<std::int32_t>(i);
    if (!mergeable(p.type)) {
      reserved.emplace(p.piece, id);
      if (p.type == Type::kUnknown) bpe_.unk = id;
      continue;
    }
    bpe_.vocab.emplace(p.piece, id);
    scores.push_back(p.score);
    if (p.type == Type::kUserDefined) {
      const auto b = static_cast<unsigned char>(p.piece[0]);
      user_symbols_[b].push_back({p.piece, id});
      user_first_[b] = true;
      has_user_symbols_ = true;
    }
  }
  for (auto& list : user_symbols_)
    std::stable_sort(list.begin(), list.end(), [](const UserSymbol& a, const UserSymbol& b) { return a.text.size() > b.text.size(); });

  // Highest score first; equal scores share a rank, so BpeModel's "leftmost on ties" decides.
  std::sort(scores.begin(), scores.end(), std::greater<>());
  scores.erase(std::unique(scores.begin(), scores.end()), scores.end());
  auto rank = [&](float s) {
    return static_cast<std::uint32_t>(std::lower_bound(scores.begin(), scores.end(), s, std::greater<>()) - scores.begin());
  };
  bpe_.merges.reserve(bpe_.vocab.size() * 2);
  for (const auto& [piece, id] : bpe_.vocab) {
    const std::uint32_t r = rank(m.pieces[static_cast<std::size_t>(id)].score);
    const std::string_view s = piece;
    for (std::size_t k = utf8_length(static_cast<unsigned char>(s[0])); k < s.size();
         k += utf8_length(static_cast<unsigned char>(s[k]))) {
      const auto left = bpe_.vocab.find(s.substr(0, k));
      const auto right = bpe_.vocab.find(s.substr(k));
      if (left != bpe_.vocab.end() && right != bpe_.vocab.end()) bpe_.merges.insert(left->second, right->second, {r, id});
    }
    for (std::size_t p = s.find(space_); p != std::string_view::npos; p = s.find(space_, p + space_.size())) {
      if (p > 0) before_space_.insert(char_before(s, p));
      if (p + space_.size() < s.size()) after_space_.insert(char_at(s, p + space_.size()));
    }
  }
  bpe_.index_ascii();
  bpe_.byte_fallback = m.byte_fallback;
  bpe_.fuse_unk = !m.byte_fallback;
  if (m.byte_fallback)
    for (unsigned b = 0; b < 256; ++b) bpe_.fallback_ids[b] = reserved.at(byte_piece(b));
  // A cut at a space: when that space is a piece (or unknown bytes are spelled out rather than
  // fused) no run of unk can straddle it.
  cut_words_ = m.byte_fallback || bpe_.vocab.count(space_) != 0;
  std::vector<bool> held(128 * 128);
  for (const auto& [piece, id] : bpe_.vocab)
    for (std::size_t k = 0; k + 1 < piece.size(); ++k) {
      const auto a = static_cast<unsigned char>(piece[k]), b = static_cast<unsigned char>(piece[k + 1]);
      if (a < 0x80 && b < 0x80) held[a * 128 + b] = true;
    }
  for (unsigned a = 0; a < 128; ++a)
    for (unsigned b = 0; b < 128; ++b)
      ascii_cut_[a * 128 + b] = !held[a * 128 + b] && (m.byte_fallback || bpe_.ascii_ids[a] >= 0 || bpe_.ascii_ids[b] >= 0);
}

void SentencePieceBpe::normalize(std::string_view text, std::string& out) const {
  out.clear();
  const bool remove_extra = normalizer_.remove_extra_whitespaces;
  std::size_t i = 0;
  if (remove_extra)
    while (i < text.size() && text[i] == ' ') ++i;
  if (i == text.size()) return;
  out.reserve(text.size() + text.size() / 2 + 8);
  if (!suffix_ && normalizer_.add_dummy_prefix) out += space_;
  bool prev_space = remove_extra;
  for (; i < text.size(); ++i) {
    if (text[i] != ' ') {
      out += text[i];
      prev_space = false;
    } else if (!(remove_extra && prev_space)) {
      out += space_;
      prev_space = remove_extra;
    }
  }
  if (remove_extra)
    while (out.size() >= space_.size() && out.compare(out.size() - space_.size(), space_.size(), space_) == 0)
      out.resize(out.size() - space_.size());
  if (suffix_ && normalizer_.add_dummy_prefix) out += space_;
}

void SentencePieceBpe::encode_word(std::string_view w, std::vector<std::int32_t>& out) const {
  std::size_t start = 0;
  for (std::size_t p = 1; p < w.size(); ++p) {
    const auto a = static_cast<unsigned char>(w[p - 1]), b = static_cast<unsigned char>(w[p]);
    if ((a | b) < 0x80 && ascii_cut_[a * 128 + b]) {
      bpe_.encode_word(w.substr(start, p - start), out);
      start = p;
    }
  }
  bpe_.encode_word(w.substr(start), out);
}

void SentencePieceBpe::encode_span(std::string_view s, std::vector<std::int32_t>& out) const {
  if (!cut_words_) {
    encode_word(s, out);
    return;
  }
  const std::size_t len = space_.size();
  std::size_t word = 0;
  for (std::size_t p = s.find(space_); p != std::string_view::npos; p = s.find(space_, p + len)) {
    if (p > word && !before_space_.contains(char_before(s, p))) {
      encode_word(s.substr(word, p - word), out);
      word = p;
    }
    const std::size_t q = p + len;
    if (q < s.size() && !after_space_.contains(char_at(s, q))) {
      encode_word(s.substr(word, q - word), out);
      word = q;
    }
  }
  encode_word(s.substr(word), out);
}

void SentencePieceBpe::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  thread_local std::string normalized;
  normalize(text, normalized);
  encode_normalized(normalized, out);
  if (normalized.capacity() > (std::size_t{64} << 20)) std::string().swap(normalized);  // one huge document
}

void SentencePieceBpe::encode_normalized(std::string_view s, std::vector<std::int32_t>& out) const {
  if (!has_user_symbols_) {
    encode_span(s, out);
    return;
  }
  // User-defined symbols are frozen, so they cut the text. Every first byte of one is a UTF-8 lead
  // byte, so a byte scan only stops where a character starts, as libsentencepiece's matcher does.
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const UserSymbol* hit = nullptr;
    if (user_first_[b])
      for (const auto& u : user_symbols_[b])
        if (s.compare(i, u.text.size(), u.text) == 0) {
          hit = &u;
          break;
        }
    if (!hit) {
      ++i;
      continue;
    }
    encode_span(s.substr(start, i - start), out);
    out.push_back(hit->id);
    i += hit->text.size();
    start = i;
  }
  encode_span(s.substr(start), out);
}

}  // namespace dlm::data::tok
