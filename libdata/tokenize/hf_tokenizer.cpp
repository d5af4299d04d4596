#include "hf_tokenizer.h"

#include "dlm/common/error.h"
#include "text.h"
#include "unicode_normalize.h"

namespace dlm::data::tok {
namespace {

// A split of the text as `tokenizers` keeps them: a run of text, or an added token already decided.
struct Split {
  std::string_view text;
  std::int32_t id = -1;
};

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (s.find(from) == std::string::npos) return;
  std::string out;
  out.reserve(s.size());
  std::size_t at = 0;
  for (std::size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(s, at, hit - at);
    out.append(to);
  }
  out.append(s, at);
  s = std::move(out);
}

std::string normalize(std::string_view text, const std::vector<Normalizer>& steps) {
  std::string s(text);
  std::vector<Span> spans;
  for (const auto& n : steps) {
    switch (n.kind) {
      case Normalizer::Kind::kPrepend:
        if (!s.empty()) s.insert(0, n.text);
        break;
      case Normalizer::Kind::kReplace:
        if (!n.regex) {
          replace_all(s, n.text, n.content);
        } else {
          spans.clear();
          n.regex->find_all(s, spans);
          std::string out;
          std::size_t at = 0;
          for (const auto& m : spans) {
            out.append(s, at, m.begin - at);
            out += n.content;
            at = m.end;
          }
          out.append(s, at);
          s = std::move(out);
        }
        break;
      default: {
        using K = Normalizer::Kind;
        const auto form = n.kind == K::kNfc ? UnicodeForm::kNfc : n.kind == K::kNfd ? UnicodeForm::kNfd
                          : n.kind == K::kNfkc ? UnicodeForm::kNfkc : UnicodeForm::kNfkd;
        s = unicode_normalize(s, form);
      }
    }
  }
  return s;
}

// Regex matches taken at a time: a document of 1 GB holds ~250M words, and collecting them all first
// (16 bytes a match, 24 a split) cost 15x the text.
constexpr std::size_t kMatchChunk = 4096;

// Cuts `text` at the matches of `p` (a Split pre-tokenizer) and hands `piece` the non-empty pieces, in order.
template <class Piece>
void split_by(const PreTokenizer& p, std::string_view text, std::vector<Span>& matches, Piece&& piece) {
  auto emit = [&](std::size_t b, std::size_t e) {
    if (e > b) piece(text.substr(b, e - b));
  };
  using B = PreTokenizer::Behavior;
  std::size_t at = 0;    // where the next piece starts
  std::size_t from = 0;  // where the search goes on
  while (from < text.size()) {
    matches.clear();
    if (p.regex) {
      from = p.regex->find_some(text, from, matches, kMatchChunk);
    } else {
      std::size_t hit = std::string_view::npos;
      while (matches.size() < kMatchChunk && (hit = text.find(p.literal, from)) != std::string_view::npos) {
        matches.push_back({hit, hit + p.literal.size()});
        from = hit + p.literal.size();
      }
      if (hit == std::string_view::npos) from = text.size();
    }
    for (const auto& m : matches) {
      switch (p.behavior) {
        case B::kIsolated:
          emit(at, m.begin);
          emit(m.begin, m.end);
          at = m.end;
          break;
        case B::kRemoved:
          emit(at, m.begin);
          at = m.end;
          break;
        case B::kMergedWithPrevious:
          emit(at, m.end);
          at = m.end;
          break;
        case B::kMergedWithNext:
          emit(at, m.begin);
          at = m.begin;
          break;
      }
    }
  }
  emit(at, text.size());
}

// The pre-tokenizers as a pipeline, depth first: a word reaches the model as soon as the last stage cuts
// it, in the order `tokenizers` would list it, so memory is a chunk of matches per stage, not the
// document's word list. `fed_` counts each stage's input splits (added tokens included), because
// Metaspace's prepend_scheme "first" applies to a stage's first split only.
class PreTokenizerPipeline {
 public:
  PreTokenizerPipeline(const HfConfig& c, std::vector<std::int32_t>& out)
      : c_(c), out_(out), fed_(c.pre_tokenizers.size(), 0), matches_(c.pre_tokenizers.size()) {}

  void feed(std::size_t stage, Split s) {
    if (stage == c_.pre_tokenizers.size()) {
      if (s.id >= 0) {
        out_.push_back(s.id);
      } else {
        c_.model.encode_word(s.text, out_);
      }
      return;
    }
    const bool first = fed_[stage]++ == 0;
    if (s.id >= 0) return feed(stage + 1, s);
    const PreTokenizer& p = c_.pre_tokenizers[stage];
    std::vector<Span>& matches = matches_[stage];
    auto next = [&](std::string_view piece) { feed(stage + 1, {piece}); };
    switch (p.kind) {
      case PreTokenizer::Kind::kSplit:
        split_by(p, s.text, matches, next);
        break;
      case PreTokenizer::Kind::kByteLevel: {
        std::string_view t = s.text;
        std::string prefixed;
        if (p.add_prefix_space && !t.starts_with(' ')) t = prefixed = " " + std::string(t);
        if (!p.regex) {
          next(t);
          break;
        }
        for (std::size_t at = 0; at < t.size();) {
          matches.clear();
          at = p.regex->find_some(t, at, matches, kMatchChunk);
          for (const auto& m : matches) next(t.substr(m.begin, m.end - m.begin));
        }
        break;
      }
      case PreTokenizer::Kind::kMetaspace: {
        std::string m(s.text);
        replace_all(m, " ", p.replacement);
        const bool prepend = p.prepend == PreTokenizer::Prepend::kAlways ||
                             (p.prepend == PreTokenizer::Prepend::kFirst && first);
        if (prepend && !m.starts_with(p.replacement)) m.insert(0, p.replacement);
        const std::string_view t = m;
        if (!p.split) {
          next(t);
          break;
        }
        std::size_t at = 0;
        for (std::size_t hit = t.find(p.replacement, 1); hit != std::string_view::npos;
             hit = t.find(p.replacement, hit + 1)) {
          if (hit > at) next(t.substr(at, hit - at));
          at = hit;
        }
        if (at < t.size()) next(t.substr(at));
        break;
      }
    }
  }

 private:
  const HfConfig& c_;
  std::vector<std::int32_t>& out_;
  std::vector<std::size_t> fed_;
  std::vector<std::vector<Span>> matches_;
};

}  // namespace

HuggingFaceTokenizer::HuggingFaceTokenizer(HfConfig config, bool include_special_tokens, std::string kind)
    : c_(std::move(config)),
      raw_(c_.raw_added),
      normalized_(c_.normalized_added),
      include_special_tokens_(include_special_tokens),
      kind_(std::move(kind)) {}

void HuggingFaceTokenizer::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  if (valid_utf8(text)) {
    encode_valid(text, out);
  } else {
    encode_valid(repair_utf8(text), out);
  }
}

void HuggingFaceTokenizer::encode_valid(std::string_view text, std::vector<std::int32_t>& out) const {
  const bool with_template = include_special_tokens_ && !c_.template_single.empty();
  std::size_t body = out.size();
  if (with_template) {
    for (auto id : c_.template_single) {
      if (id == -1) break;
      out.push_back(id);
    }
    body = out.size();
  }

  // 1-2. Added tokens in the raw text, then normalization and normalized added tokens; 3-4. each split
  // through the pre-tokenizers and the model as it comes.
  PreTokenizerPipeline pipeline(c_, out);
  std::string normalized;
  std::vector<AddedTokenMatcher::Piece> raw, norm;
  raw_.split(text, raw);
  for (const auto& r : raw) {
    if (r.id >= 0) {
      pipeline.feed(0, {{}, r.id});
      continue;
    }
    std::string_view piece = r.text;
    if (!c_.normalizers.empty()) piece = normalized = normalize(piece, c_.normalizers);
    norm.clear();
    normalized_.split(piece, norm);
    for (const auto& n : norm) pipeline.feed(0, {n.text, n.id});
  }
  if (with_template) {
    bool after = false;
    for (auto id : c_.template_single) {
      if (after) out.push_back(id);
      after = after || id == -1;
    }
  }
  (void)body;
}

std::string HuggingFaceTokenizer::decode(std::span<const std::int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (auto id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= c_.id_to_token.size())
      fail("HuggingFaceTokenizer: cannot decode id " + std::to_string(id) + " (vocabulary " +
           std::to_string(c_.vocab_size) + ")");
    tokens.push_back(c_.id_to_token[static_cast<std::size_t>(id)]);
  }
  if (!c_.has_decoder) {
    std::string out;
    for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  using K = Decoder::Kind;
  for (const auto& d : c_.decoders) {
    switch (d.kind) {
      case K::kByteLevel:
        // A token spelled entirely in byte-level characters stands for those bytes; any other
        // (an added token) for its own text.
        for (auto& t : tokens) {
          std::string raw;
          bool all = true;
          for (std::size_t i = 0; i < t.size() && all;) {
            const int b = char_to_byte(next_code_point(t, i));
            all = b >= 0;
            raw.push_back(static_cast<char>(b));
          }
          if (all) t = std::move(raw);
        }
        break;
      case K::kMetaspace:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          replace_all(tokens[i], d.pattern, " ");
          if (i == 0 && d.prepend && tokens[i].starts_with(' ')) tokens[i].erase(0, 1);
        }
        break;
      case K::kReplace:
        for (auto& t : tokens) replace_all(t, d.pattern, d.content);
        break;
      case K::kByteFallback: {
        std::vector<std::string> merged;
        std::string bytes;
        auto flush = [&] {
          if (bytes.empty()) return;
          if (valid_utf8(bytes)) {
            merged.push_back(bytes);
          } else {
            for (std::size_t k = 0; k < bytes.size(); ++k) merged.emplace_back("\xEF\xBF\xBD");
          }
          bytes.clear();
        };
        for (auto& t : tokens) {
          if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
              std::isxdigit(static_cast<unsigned char>(t[4]))) {
            bytes.push_back(static_cast<char>(std::strtol(t.substr(3, 2).c_str(), nullptr, 16)));
          } else {
            flush();
            merged.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(merged);
        break;
      }
      case K::kFuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case K::kStrip:
        for (auto& t : tokens) {
          std::size_t n = 0;
          while (n < d.start && t.compare(n * d.content.size(), d.content.size(), d.content) == 0) ++n;
          t.erase(0, n * d.content.size());
          n = 0;
          while (n < d.stop && t.size() >= (n + 1) * d.content.size() &&
                 t.compare(t.size() - (n + 1) * d.content.size(), d.content.size(), d.content) == 0)
            ++n;
          t.resize(t.size() - n * d.content.size());
        }
        break;
    }
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace dlm::data::tok
