// tokenizer.json -> HfConfig. Every field that changes the ids is read; anything this file does
// not implement is refused with "unsupported: <json path>" rather than ignored.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dlm/common/error.h"
#include "hf_tokenizer.h"
#include "text.h"

namespace dlm::data::tok {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

Decoder decoder_of(Decoder::Kind kind) {
  Decoder d;
  d.kind = kind;
  return d;
}

struct Reader {
  std::string file;

  [[noreturn]] void unsupported(const std::string& path, const json& value) const {
    std::string shown = value.dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    fail_at(file, "unsupported: " + path + " = " + shown);
  }
  [[noreturn]] void bad(const std::string& path, const std::string& what) const { fail_at(file, path + ": " + what); }

  const json& field(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object()) bad(path, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) bad(path + "." + key, "missing");
    return *it;
  }
  std::string str(const json& obj, const std::string& path, const char* key) const {
    const json& v = field(obj, path, key);
    if (!v.is_string()) bad(path + "." + key, "expected a string");
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& path, const char* key, bool fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) bad(path + "." + key, "expected true or false");
    return it->get<bool>();
  }
  std::string type(const json& obj, const std::string& path) const { return str(obj, path, "type"); }

  // A Split/Replace pattern: {"String": s} or {"Regex": r}.
  void pattern(const json& obj, const std::string& path, std::string& literal, std::shared_ptr<Regex>& regex) const {
    const json& p = field(obj, path, "pattern");
    if (p.contains("String") && p["String"].is_string()) {
      literal = p["String"].get<std::string>();
    } else if (p.contains("Regex") && p["Regex"].is_string()) {
      regex = std::make_shared<Regex>(p["Regex"].get<std::string>(), file + ": " + path + ".pattern.Regex");
    } else {
      bad(path + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
    }
  }

  void normalizer(const json& n, const std::string& path, std::vector<Normalizer>& out) const {
    if (n.is_null()) return;
    const std::string t = type(n, path);
    using K = Normalizer::Kind;
    if (t == "Sequence") {
      const json& list = field(n, path, "normalizers");
      if (!list.is_array()) bad(path + ".normalizers", "expected a list");
      for (std::size_t i = 0; i < list.size(); ++i)
        normalizer(list[i], path + ".normalizers[" + std::to_string(i) + "]", out);
    } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
      out.push_back({t == "NFC" ? K::kNfc : t == "NFD" ? K::kNfd : t == "NFKC" ? K::kNfkc : K::kNfkd, {}, {}, {}});
    } else if (t == "Prepend") {
      out.push_back({K::kPrepend, str(n, path, "prepend"), {}, {}});
    } else if (t == "Replace") {
      Normalizer r{K::kReplace, {}, str(n, path, "content"), {}};
      pattern(n, path, r.text, r.regex);
      if (!r.regex && r.text.empty()) bad(path + ".pattern", "empty pattern");
      out.push_back(std::move(r));
    } else {
      unsupported(path + ".type", t);
    }
  }

  void pre_tokenizer(const json& p, const std::string& path, std::vector<PreTokenizer>& out) const {
    if (p.is_null()) return;
    const std::string t = type(p, path);
    using K = PreTokenizer::Kind;
    if (t == "Sequence") {
      const json& list = field(p, path, "pretokenizers");
      if (!list.is_array()) bad(path + ".pretokenizers", "expected a list");
      for (std::size_t i = 0; i < list.size(); ++i)
        pre_tokenizer(list[i], path + ".pretokenizers[" + std::to_string(i) + "]", out);
    } else if (t == "ByteLevel") {
      PreTokenizer b;
      b.kind = K::kByteLevel;
      b.add_prefix_space = flag(p, path, "add_prefix_space", true);
      if (flag(p, path, "use_regex", true)) b.regex = std::make_shared<Regex>(kGpt2Pattern, "ByteLevel");
      out.push_back(std::move(b));
    } else if (t == "Split") {
      PreTokenizer s;
      s.kind = K::kSplit;
      pattern(p, path, s.literal, s.regex);
      if (!s.regex && s.literal.empty()) bad(path + ".pattern", "empty pattern");
      if (flag(p, path, "invert", false)) unsupported(path + ".invert", true);
      const std::string b = str(p, path, "behavior");
      using B = PreTokenizer::Behavior;
      if (b == "Isolated") s.behavior = B::kIsolated;
      else if (b == "Removed") s.behavior = B::kRemoved;
      else if (b == "MergedWithPrevious") s.behavior = B::kMergedWithPrevious;
      else if (b == "MergedWithNext") s.behavior = B::kMergedWithNext;
      else unsupported(path + ".behavior", b);
      out.push_back(std::move(s));
    } else if (t == "Metaspace") {
      PreTokenizer m;
      m.kind = K::kMetaspace;
      m.replacement = str(p, path, "replacement");
      if (m.replacement.empty()) bad(path + ".replacement", "empty");
      m.prepend = prepend_scheme(p, path);
      m.split = flag(p, path, "split", true);
      out.push_back(std::move(m));
    } else {
      unsupported(path + ".type", t);
    }
  }

  PreTokenizer::Prepend prepend_scheme(const json& p, const std::string& path) const {
    using P = PreTokenizer::Prepend;
    if (p.contains("prepend_scheme")) {
      const std::string s = str(p, path, "prepend_scheme");
      if (s == "always") return P::kAlways;
      if (s == "first") return P::kFirst;
      if (s == "never") return P::kNever;
      unsupported(path + ".prepend_scheme", s);
    }
    return flag(p, path, "add_prefix_space", true) ? P::kAlways : P::kNever;
  }

  void decoder(const json& d, const std::string& path, std::vector<Decoder>& out) const {
    if (d.is_null()) return;
    const std::string t = type(d, path);
    using K = Decoder::Kind;
    if (t == "Sequence") {
      const json& list = field(d, path, "decoders");
      if (!list.is_array()) bad(path + ".decoders", "expected a list");
      for (std::size_t i = 0; i < list.size(); ++i) decoder(list[i], path + ".decoders[" + std::to_string(i) + "]", out);
    } else if (t == "ByteLevel") {
      out.push_back(decoder_of(K::kByteLevel));
    } else if (t == "Metaspace") {
      Decoder m;
      m.kind = K::kMetaspace;
      m.pattern = str(d, path, "replacement");
      m.prepend = prepend_scheme(d, path) != PreTokenizer::Prepend::kNever;
      out.push_back(std::move(m));
    } else if (t == "Replace") {
      Decoder r;
      r.kind = K::kReplace;
      std::shared_ptr<Regex> regex;
      pattern(d, path, r.pattern, regex);
      if (regex || r.pattern.empty()) unsupported(path + ".pattern", d["pattern"]);
      r.content = str(d, path, "content");
      out.push_back(std::move(r));
    } else if (t == "ByteFallback" || t == "Fuse") {
      out.push_back(decoder_of(t == "Fuse" ? K::kFuse : K::kByteFallback));
    } else if (t == "Strip") {
      Decoder s;
      s.kind = K::kStrip;
      s.content = str(d, path, "content");
      const json& a = field(d, path, "start");
      const json& b = field(d, path, "stop");
      if (!a.is_number_unsigned() || !b.is_number_unsigned()) bad(path, "start and stop must be counts");
      s.start = a.get<std::size_t>();
      s.stop = b.get<std::size_t>();
      out.push_back(std::move(s));
    } else {
      unsupported(path + ".type", t);
    }
  }
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_errno(path, "open", errno);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json parse(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    fail_at_offset(path, e.byte, "not valid JSON: " + std::string(e.what()).substr(0, 160));
  } catch (const json::exception& e) {
    // A number beyond double's range (out_of_range 406, found by the GPT-2 vocab fuzzer) and the like.
    fail_at(path, "not valid JSON: " + std::string(e.what()).substr(0, 160));
  }
}

std::int32_t id_value(const Reader& r, const json& v, const std::string& path) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > (1 << 30))
    r.bad(path, "expected a token id (an integer from 0 to 2^30)");
  return v.get<std::int32_t>();
}

// Ids must be dense (every id from 0 to the largest names a token), as len(tokenizer) counts tokens and
// Megatron sizes the embedding and picks the .bin dtype from it. `ids` has one flag per id seen; an id
// past the number of entries the file has cannot be dense and is refused before anything is sized by it.
void note_id(const Reader& r, std::int32_t id, std::size_t entries, const std::string& path, std::vector<bool>& ids) {
  const auto at = static_cast<std::size_t>(id);
  if (at >= entries)
    r.bad(path, "id " + std::to_string(id) + " is past the " + std::to_string(entries) +
                    " entries of model.vocab and added_tokens: ids must be dense from 0");
  if (at >= ids.size()) ids.resize(at + 1, false);
  ids[at] = true;
}

void read_model(const Reader& r, const json& m, HfConfig& c, bool byte_level, std::size_t entries,
                std::vector<bool>& ids) {
  const std::string path = "model";
  if (!m.is_object()) r.bad(path, "expected an object");
  const std::string t = m.contains("type") ? r.type(m, path) : "BPE";
  if (t != "BPE") r.unsupported("model.type", t);
  if (m.contains("dropout") && !m["dropout"].is_null()) r.unsupported("model.dropout", m["dropout"]);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
      r.unsupported(std::string("model.") + k, m[k]);
  BpeModel& b = c.model;
  b.symbols = byte_level ? BpeModel::Symbols::kBytes : BpeModel::Symbols::kChars;
  b.ignore_merges = r.flag(m, path, "ignore_merges", false);
  b.fuse_unk = r.flag(m, path, "fuse_unk", false);
  b.byte_fallback = r.flag(m, path, "byte_fallback", false);

  const json& vocab = r.field(m, path, "vocab");
  if (!vocab.is_object()) r.bad("model.vocab", "expected an object of token -> id");
  Vocab by_text;  // tokens as written, for merges
  by_text.reserve(vocab.size());
  std::int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::int32_t id = id_value(r, it.value(), "model.vocab[\"" + it.key() + "\"]");
    note_id(r, id, entries, "model.vocab[\"" + it.key() + "\"]", ids);
    if (static_cast<std::size_t>(id) >= c.id_to_token.size()) c.id_to_token.resize(static_cast<std::size_t>(id) + 1);
    if (!c.id_to_token[static_cast<std::size_t>(id)].empty())
      r.bad("model.vocab[\"" + it.key() + "\"]", "duplicate id " + std::to_string(id) + " (also \"" +
                                                  c.id_to_token[static_cast<std::size_t>(id)] + "\")");
    c.id_to_token[static_cast<std::size_t>(id)] = it.key();
    by_text.emplace(it.key(), id);
    max_id = std::max(max_id, id);
    std::string key = it.key();
    if (byte_level) {
      // Byte-level tokens are spelled in GPT-2's printable characters; keep them as raw bytes.
      std::string raw;
      bool all = true;
      for (std::size_t i = 0; i < key.size() && all;) {
        const int byte = char_to_byte(next_code_point(key, i));
        if (byte < 0) all = false;
        raw.push_back(static_cast<char>(byte));
      }
      if (all) key = std::move(raw);
      if (key.size() == 1) b.byte_ids[static_cast<unsigned char>(key[0])] = id;
    } else if (key.size() == 6 && key.starts_with("<0x") && key[5] == '>') {
      const auto hex = std::strtol(key.substr(3, 2).c_str(), nullptr, 16);
      if (std::isxdigit(static_cast<unsigned char>(key[3])) && std::isxdigit(static_cast<unsigned char>(key[4])))
        b.fallback_ids[static_cast<std::size_t>(hex)] = id;
    }
    b.vocab.emplace(std::move(key), id);
  }
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const std::string unk = r.str(m, path, "unk_token");
    auto it = by_text.find(unk);
    if (it == by_text.end()) r.bad("model.unk_token", "\"" + unk + "\" is not in model.vocab");
    b.unk = it->second;
  }

  const json& merges = r.field(m, path, "merges");
  if (!merges.is_array()) r.bad("model.merges", "expected a list");
  b.merges.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const std::string where = "model.merges[" + std::to_string(i) + "]";
    std::string left, right;
    const json& e = merges[i];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) r.bad(where, "expected \"left right\"");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      r.bad(where, "expected \"left right\" or [left, right]");
    }
    auto a = by_text.find(left), bb = by_text.find(right), ab = by_text.find(left + right);
    if (a == by_text.end()) r.bad(where, "token \"" + left + "\" is not in model.vocab");
    if (bb == by_text.end()) r.bad(where, "token \"" + right + "\" is not in model.vocab");
    if (ab == by_text.end()) r.bad(where, "merged token \"" + left + right + "\" is not in model.vocab");
    b.merges.insert(a->second, bb->second, {static_cast<std::uint32_t>(i), ab->second});
  }
  c.vocab_size = static_cast<std::size_t>(max_id + 1);
}

void read_added(const Reader& r, const json& list, HfConfig& c, std::size_t entries, std::vector<bool>& ids) {
  if (list.is_null()) return;
  if (!list.is_array()) r.bad("added_tokens", "expected a list");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    const json& t = list[i];
    AddedToken a;
    a.id = id_value(r, r.field(t, path, "id"), path + ".id");
    note_id(r, a.id, entries, path + ".id", ids);
    a.content = r.str(t, path, "content");
    if (a.content.empty()) r.bad(path + ".content", "empty");
    if (r.flag(t, path, "single_word", false)) r.unsupported(path + ".single_word", true);
    a.lstrip = r.flag(t, path, "lstrip", false);
    a.rstrip = r.flag(t, path, "rstrip", false);
    const bool special = r.flag(t, path, "special", false);
    const bool normalized = r.flag(t, path, "normalized", !special);
    const auto id = static_cast<std::size_t>(a.id);
    if (id >= c.id_to_token.size()) c.id_to_token.resize(id + 1);
    c.id_to_token[id] = a.content;
    c.vocab_size = std::max(c.vocab_size, id + 1);
    (normalized ? c.normalized_added : c.raw_added).push_back(std::move(a));
  }
}

void read_post_processor(const Reader& r, const json& p, const std::string& path, HfConfig& c) {
  if (p.is_null()) return;
  const std::string t = r.type(p, path);
  if (t == "Sequence") {
    const json& list = r.field(p, path, "processors");
    for (std::size_t i = 0; i < list.size(); ++i)
      read_post_processor(r, list[i], path + ".processors[" + std::to_string(i) + "]", c);
  } else if (t == "ByteLevel") {
    // Adjusts offsets only.
  } else if (t == "TemplateProcessing") {
    const json& single = r.field(p, path, "single");
    const json& specials = r.field(p, path, "special_tokens");
    if (!single.is_array()) r.bad(path + ".single", "expected a list");
    for (std::size_t i = 0; i < single.size(); ++i) {
      const std::string where = path + ".single[" + std::to_string(i) + "]";
      const json& piece = single[i];
      if (piece.contains("Sequence")) {
        c.template_single.push_back(-1);
      } else if (piece.contains("SpecialToken")) {
        const std::string name = r.str(piece["SpecialToken"], where + ".SpecialToken", "id");
        if (!specials.contains(name)) r.bad(where, "special token \"" + name + "\" is not in " + path + ".special_tokens");
        const json& ids = r.field(specials[name], path + ".special_tokens." + name, "ids");
        for (const auto& id : ids) c.template_single.push_back(id_value(r, id, path + ".special_tokens." + name));
      } else {
        r.bad(where, "expected Sequence or SpecialToken");
      }
    }
  } else {
    r.unsupported(path + ".type", t);
  }
}

std::optional<std::int32_t> token_id(const HfConfig& c, const json& v, const std::string& file, const char* key) {
  std::string name;
  if (v.is_string()) name = v.get<std::string>();
  else if (v.is_object() && v.contains("content") && v["content"].is_string()) name = v["content"].get<std::string>();
  else if (v.is_null()) return std::nullopt;
  else fail_at(file, std::string(key) + ": expected a token string");
  for (const auto* list : {&c.raw_added, &c.normalized_added})
    for (const auto& a : *list)
      if (a.content == name) return a.id;
  for (std::size_t i = 0; i < c.id_to_token.size(); ++i)
    if (c.id_to_token[i] == name) return static_cast<std::int32_t>(i);
  fail_at(file, std::string(key) + ": \"" + name + "\" is not in the vocabulary");
}

// Megatron's HuggingFaceTokenizer takes bos/eos/pad/mask from transformers' tokenizer_config.json;
// eod is the eos token (the sep token when there is no eos, the cls token standing in for bos).
void read_tokenizer_config(const std::string& path, HfConfig& c) {
  const json cfg = parse(path);
  if (!cfg.is_object()) fail_at(path, "expected a JSON object");
  auto get = [&](const char* key) -> std::optional<std::int32_t> {
    auto it = cfg.find(key);
    return it == cfg.end() ? std::nullopt : token_id(c, *it, path, key);
  };
  c.special.bos = get("bos_token");
  c.special.eos = get("eos_token");
  c.special.pad = get("pad_token");
  c.special.mask = get("mask_token");
  if (!c.special.eos) c.special.eos = get("sep_token");
  if (!c.special.bos) c.special.bos = get("cls_token");
  c.special.eod = c.special.eos;
}

}  // namespace

HfConfig hf_config_from_json(const nlohmann::json& j, const std::string& file) {
  Reader r{file};
  if (!j.is_object()) r.bad("(top level)", "expected a JSON object");
  for (const char* k : {"truncation", "padding"})
    if (j.contains(k) && !j[k].is_null()) r.unsupported(k, j[k]);
  HfConfig c;
  r.normalizer(j.value("normalizer", json()), "normalizer", c.normalizers);
  r.pre_tokenizer(j.value("pre_tokenizer", json()), "pre_tokenizer", c.pre_tokenizers);
  bool byte_level = false;
  for (const auto& p : c.pre_tokenizers) byte_level = byte_level || p.kind == PreTokenizer::Kind::kByteLevel;
  if (!j.contains("model")) r.bad("model", "missing");
  const json added = j.value("added_tokens", json());
  const json& model = j["model"];
  const std::size_t entries = (model.is_object() && model.contains("vocab") ? model["vocab"].size() : 0) +
                              (added.is_array() ? added.size() : 0);
  std::vector<bool> ids;
  read_model(r, model, c, byte_level, entries, ids);
  read_added(r, added, c, entries, ids);
  for (std::size_t id = 0; id < ids.size(); ++id)
    if (!ids[id])
      r.bad("model.vocab", "no token has id " + std::to_string(id) + ", but ids go up to " +
                               std::to_string(ids.size() - 1) + ": ids must be dense from 0");
  read_post_processor(r, j.value("post_processor", json()), "post_processor", c);
  const json d = j.value("decoder", json());
  c.has_decoder = !d.is_null();
  r.decoder(d, "decoder", c.decoders);
  return c;
}

nlohmann::json read_json(const std::string& path) { return parse(path); }

HfConfig load_hf_config(const std::string& given) {
  std::string file = given;
  std::string config_file;
  if (fs::is_directory(given)) {
    file = (fs::path(given) / "tokenizer.json").string();
    if (!fs::exists(file)) fail_at(given, "no tokenizer.json in this folder");
  }
  if (fs::path(file).filename() == "tokenizer.json") {
    const auto cfg = fs::path(file).parent_path() / "tokenizer_config.json";
    if (fs::exists(cfg)) config_file = cfg.string();
  }
  HfConfig c = hf_config_from_json(parse(file), file);
  if (!config_file.empty()) read_tokenizer_config(config_file, c);
  return c;
}

}  // namespace dlm::data::tok
