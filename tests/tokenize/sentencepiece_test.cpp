// SentencePiece .model files: which encoder a model takes (native BPE, native unigram or
// libsentencepiece, and why), hand-computed ids of hand-written BPE and unigram models (score order,
// ties, user-defined symbols, byte fallback, fused unk, the normalizer flags), the native BPE encoder
// against libsentencepiece on random text for hand-written models and models trained here by
// libsentencepiece's trainer, and the unigram encoder on sentencepiece's own test models (ids from
// Python sentencepiece 0.2.3; interop_sentencepiece_unigram.py compares whole corpora); native
// decoding as Python sentencepiece 0.2.3 decodes hand-written models.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "../../libdata/tokenize/kinds.h"
#include "../../libdata/tokenize/sentencepiece_model.h"
#include "dlm/common/error.h"
#include "dlm/data/tokenizer.h"

namespace fs = std::filesystem;
using dlm::data::Tokenizer;
using dlm::data::TokenizerOptions;
using Ids = std::vector<std::int32_t>;
using Type = dlm::data::tok::SentencePieceModel::PieceType;

namespace {

// A ModelProto written field by field (protobuf wire format).
struct ProtoWriter {
  std::string out;
  void varint(std::uint64_t v) {
    for (; v >= 0x80; v >>= 7) out += static_cast<char>((v & 0x7F) | 0x80);
    out += static_cast<char>(v);
  }
  void tag(int field, int wire) { varint(static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire)); }
  void number(int field, std::uint64_t v) { tag(field, 0), varint(v); }
  void bytes(int field, const std::string& s) { tag(field, 2), varint(s.size()), out += s; }
  void real(int field, float f) {
    tag(field, 5);
    char b[4];
    std::memcpy(b, &f, 4);
    out.append(b, 4);
  }
};

struct Spec {
  struct Piece {
    std::string text;
    float score;
    Type type;
  };
  std::vector<Piece> pieces;
  int model_type = 2;  // BPE; 1: unigram
  bool byte_fallback = true;
  bool suffix = false;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = false;
  bool escape_whitespaces = true;
  std::string charsmap;  // precompiled_charsmap; empty: none
  std::string unk_surface;  // TrainerSpec.unk_surface; empty: not set

  std::string proto() const {
    ProtoWriter m;
    for (const auto& p : pieces) {
      ProtoWriter w;
      w.bytes(1, p.text);
      w.real(2, p.score);
      w.number(3, static_cast<std::uint64_t>(p.type));
      m.bytes(1, w.out);
    }
    ProtoWriter t;
    t.number(3, static_cast<std::uint64_t>(model_type));
    t.number(24, suffix);
    t.number(35, byte_fallback);
    if (!unk_surface.empty()) t.bytes(44, unk_surface);
    m.bytes(2, t.out);
    ProtoWriter n;
    n.bytes(1, "identity");
    if (!charsmap.empty()) n.bytes(2, charsmap);
    n.number(3, add_dummy_prefix);
    n.number(4, remove_extra_whitespaces);
    n.number(5, escape_whitespaces);
    m.bytes(3, n.out);
    return m.out;
  }
};

// ids: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258 (with byte fallback), then the pieces below.
Spec tiny(bool byte_fallback = true) {
  Spec s;
  s.byte_fallback = byte_fallback;
  s.pieces = {{"<unk>", 0, Type::kUnknown}, {"<s>", 0, Type::kControl}, {"</s>", 0, Type::kControl}};
  if (byte_fallback)
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      s.pieces.push_back({name, 0, Type::kByte});
    }
  for (const auto& [text, score] : std::vector<std::pair<std::string, float>>{
           {"\u2581", -100}, {"a", -100}, {"b", -100}, {"c", -100}, {"\u2581a", -1}, {"ab", -2}, {"bc", -3},
           {"\u2581ab", -4}, {"\u2581\u2581", -5}, {"ca", -6}, {"ac", -6}})
    s.pieces.push_back({text, score, Type::kNormal});
  s.pieces.push_back({"[X]", 0, Type::kUserDefined});
  return s;
}

class Models {
 public:
  Models() : dir_(fs::temp_directory_path() / ("dlm_sp_test_" + std::to_string(::getpid()))) { fs::create_directories(dir_); }
  ~Models() { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return (dir_ / name).string();
  }
  // A model trained by libsentencepiece's trainer on generated text (words from several scripts).
  std::string train(const std::string& name, const std::string& flags) const {
    const auto text = dir_ / "train.txt";
    if (!fs::exists(text)) {
      const char* syllables[] = {"the", "of", "to", "ken", "iz", "er", "da", "ta", "x=", "1;", "\u6f22", "\u5b57",
                                 "\u043c\u0438", "\u0440", "\u0928\u092e", "caf", "\u00e9", "\u2581", "[X]", "<tag>",
                                 "ab", "c", "\U0001F600", "qu", "ing", "\u00e0"};
      const char* gaps[] = {" ", " ", " ", " ", "  ", "", "\t", " \u2581"};
      std::mt19937 rng(7);
      std::ofstream f(text);
      for (int line = 0; line < 4000; ++line) {
        for (int w = 0; w < 12; ++w) {
          for (unsigned k = 1 + rng() % 3; k > 0; --k) f << syllables[rng() % std::size(syllables)];
          f << gaps[rng() % std::size(gaps)];
        }
        f << "\n";
      }
    }
    const auto prefix = (dir_ / name).string();
    const auto status = sentencepiece::SentencePieceTrainer::Train(
        "--input=" + text.string() + " --model_prefix=" + prefix + " --minloglevel=2 --num_threads=1 --hard_vocab_limit=false " + flags);
    EXPECT_TRUE(status.ok()) << status.ToString();
    return prefix + ".model";
  }

 private:
  fs::path dir_;
};

std::unique_ptr<Tokenizer> load(const std::string& path, bool native = true) {
  TokenizerOptions o;
  o.type = "SentencePieceTokenizer";
  o.model = path;
  return dlm::data::tok::make_sentencepiece_tokenizer(o, native);
}

std::string encoder(const std::string& path) { return dlm::data::tok::sentencepiece_encoder(*load(path)); }

// Random text over fragments that reach every rule: spaces and space runs, a literal U+2581,
// user-defined symbols and pieces of them, characters that are no piece, several scripts.
std::string random_text(std::mt19937& rng) {
  static const char* parts[] = {"a", "b", "c", "ab", "ca", " ", "  ", "   ", "\u2581", "[X]", "[X", "X]", "<tag>",
                                "\u2603", "\u00e9", "\u6f22", "\n", "\t", "x", "the", "token", "\U0001F600", "\u043c"};
  std::string s;
  const auto n = rng() % 24;
  for (unsigned i = 0; i < n; ++i) s += parts[rng() % std::size(parts)];
  return s;
}

void expect_same_as_library(const std::string& path, int samples = 3000) {
  const auto native = load(path), library = load(path, false);
  ASSERT_EQ(dlm::data::tok::sentencepiece_encoder(*native), "native BPE") << path;
  std::mt19937 rng(11);
  for (int i = 0; i < samples; ++i) {
    const auto text = random_text(rng);
    ASSERT_EQ(native->encode(text), library->encode(text)) << path << ": \"" << text << "\"";
  }
}

}  // namespace

TEST(SentencePiece, HandWrittenBpeByHand) {
  Models m;
  const auto t = load(m.write("tiny.model", tiny().proto()));
  EXPECT_EQ(dlm::data::tok::sentencepiece_encoder(*t), "native BPE");
  const std::int32_t sp = 259, a = 260, b = 261, c = 262, sp_a = 263, ab = 264, bc = 265, sp_ab = 266, sp_sp = 267,
                     ca = 268, x = 270;
  EXPECT_EQ(t->encode("abc"), (Ids{sp_a, bc}));  // by score: "▁a" (-1) first, then "bc" (-3) beats "▁ab" (-4)
  EXPECT_EQ(t->encode("ab"), (Ids{sp_ab}));
  EXPECT_EQ(t->encode("cac"), (Ids{sp, ca, c}));  // "ca" and "ac" tie: the leftmost pair merges
  EXPECT_EQ(t->encode("  a"), (Ids{sp_sp, sp_a}));
  EXPECT_EQ(t->encode("a[X]b c"), (Ids{sp_a, x, b, sp, c}));  // the user-defined symbol is never merged
  EXPECT_EQ(t->encode("a\u2603"), (Ids{sp_a, 3 + 0xE2, 3 + 0x98, 3 + 0x83}));  // byte fallback
  EXPECT_EQ(t->encode(""), Ids{});

  const auto u = load(m.write("unk.model", tiny(false).proto()));
  EXPECT_EQ(dlm::data::tok::sentencepiece_encoder(*u), "native BPE");
  // Without byte fallback a run of unknown characters is one <unk>; ids shift down by the 256 bytes.
  EXPECT_EQ(u->encode("\u2603\u2603a\u2603"), (Ids{sp - 256, 0, a - 256, 0}));

  auto s = tiny();
  s.remove_extra_whitespaces = true;
  const auto r = load(m.write("strip.model", s.proto()));
  EXPECT_EQ(r->encode("  a  b  "), (Ids{sp_a, sp, b}));
  EXPECT_EQ(r->encode("   "), Ids{});
  EXPECT_EQ(r->encode("a\u2581"), (Ids{sp_a}));  // a trailing literal U+2581 goes too, as in libsentencepiece
  s = tiny();
  s.suffix = true;
  EXPECT_EQ(load(m.write("suffix.model", s.proto()))->encode("ab"), (Ids{ab, sp}));
}

TEST(SentencePiece, EncoderTakenAndWhy) {
  Models m;
  auto unigram = tiny();
  unigram.model_type = 1;
  EXPECT_EQ(encoder(m.write("unigram.model", unigram.proto())), "native unigram");
  auto word = tiny();
  word.model_type = 3;
  EXPECT_EQ(encoder(m.write("word.model", word.proto())), "libsentencepiece: a word model");
  auto unused = tiny();
  unused.pieces.push_back({"cc", -7, Type::kUnused});
  EXPECT_NE(encoder(m.write("unused.model", unused.proto())).find("libsentencepiece: unused piece"), std::string::npos);
  auto stray = tiny();
  stray.pieces.push_back({"a\u00e9", -7, Type::kNormal});
  EXPECT_NE(encoder(m.write("stray.model", stray.proto())).find("holds a character that is no piece"), std::string::npos);
  EXPECT_EQ(encoder(m.train("nfkc", "--model_type=bpe --vocab_size=300")),
            "libsentencepiece: normalizer \"nmt_nfkc\" has a precompiled charsmap");
  EXPECT_EQ(encoder(m.train("identity", "--model_type=bpe --vocab_size=300 --normalization_rule_name=identity")),
            "native BPE");
}

TEST(SentencePiece, NativeEqualsLibraryOnHandWrittenModels) {
  Models m;
  for (bool fallback : {true, false})
    for (bool strip : {false, true})
      for (bool suffix : {false, true})
        for (bool escape : {true, false}) {
          auto s = tiny(fallback);
          s.remove_extra_whitespaces = strip;
          s.suffix = suffix;
          s.escape_whitespaces = escape;
          if (!escape) s.pieces.push_back({" a", -1.5f, Type::kNormal}), s.pieces.push_back({" ", -100, Type::kNormal});
          s.add_dummy_prefix = !(strip && suffix);
          expect_same_as_library(m.write("m.model", s.proto()), 800);
        }
}

TEST(SentencePiece, NativeEqualsLibraryOnTrainedModels) {
  Models m;
  const std::string base = "--model_type=bpe --vocab_size=400 --normalization_rule_name=identity ";
  expect_same_as_library(m.train("plain", base));
  expect_same_as_library(m.train("fallback", base + "--byte_fallback=true --user_defined_symbols=[X],<tag>"));
  // Pieces with U+2581 inside and after other characters: the word cuts must follow them.
  expect_same_as_library(m.train("spans", base + "--split_by_whitespace=false --allow_whitespace_only_pieces=true "
                                                 "--remove_extra_whitespaces=false"));
  expect_same_as_library(m.train("suffix", base + "--treat_whitespace_as_suffix=true --byte_fallback=true"));
}

TEST(SentencePiece, ProtoErrorsNameFileAndOffset) {
  const std::string good = tiny().proto();
  try {
    dlm::data::tok::parse_sentencepiece_model(good.substr(0, 9), "cut.model");
    FAIL() << "no error";
  } catch (const dlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut.model: offset"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ModelProto"), std::string::npos) << e.what();
  }
  const auto m = dlm::data::tok::parse_sentencepiece_model(good, "tiny.model");
  EXPECT_EQ(m.pieces.size(), 3u + 256u + 11u + 1u);
  EXPECT_EQ(m.pieces.back().type, Type::kUserDefined);
  EXPECT_EQ(m.normalizer.name, "identity");
  EXPECT_TRUE(m.byte_fallback);
}

// ids of a hand-written unigram model: <unk> 0, <s> 1, </s> 2, [bytes 3..258,] then these pieces.
Spec unigram_spec(bool byte_fallback) {
  Spec s = tiny(byte_fallback);
  s.model_type = 1;
  s.add_dummy_prefix = false;
  s.pieces.resize(byte_fallback ? 3 + 256 : 3);
  for (const auto& [text, score] : std::vector<std::pair<std::string, float>>{
           {"x", -1}, {"xx", -2}, {"y", -3}, {"xy", -3.5f}, {"\u2581", -4}, {"\u2581x", -2}, {"z", -50}})
    s.pieces.push_back({text, score, Type::kNormal});
  s.pieces.push_back({"<u>", -90, Type::kUserDefined});
  s.pieces.push_back({"xx<u>", -90, Type::kUserDefined});
  s.pieces.push_back({"yy", -0.5f, Type::kUnused});
  return s;
}

TEST(SentencePiece, HandWrittenUnigramByHand) {
  Models m;
  const auto t = load(m.write("unigram.model", unigram_spec(false).proto()));
  ASSERT_EQ(dlm::data::tok::sentencepiece_encoder(*t), "native unigram");
  const std::int32_t x = 3, xx = 4, y = 5, xy = 6, sp = 7, sp_x = 8, u = 10, xx_u = 11;
  // "xxx": x|xx, xx|x and x|x|x all score -3; the first offer to the end wins (the earliest start).
  EXPECT_EQ(t->encode("xxx"), (Ids{x, xx}));
  EXPECT_EQ(t->encode("xy"), (Ids{xy}));      // -3.5 beats x|y's -4
  EXPECT_EQ(t->encode("xyy"), (Ids{xy, y}));  // "yy" is unused, never offered
  EXPECT_EQ(t->encode(" x x"), (Ids{sp_x, sp_x}));
  EXPECT_EQ(t->encode("  "), (Ids{sp, sp}));
  EXPECT_EQ(t->encode("yx"), (Ids{y, x}));
  // A user-defined piece of n bytes scores 0.1 * (n - 1), whatever its own score.
  EXPECT_EQ(t->encode("xx<u>x"), (Ids{xx_u, x}));
  EXPECT_EQ(t->encode("x<u>"), (Ids{x, u}));
  // An unknown character scores min_score - 10 = -60; a run of them is one <unk>.
  EXPECT_EQ(t->encode("\u2603\u2603x\u00e9"), (Ids{0, x, 0}));
  EXPECT_EQ(t->encode(""), Ids{});

  const auto b = load(m.write("bytes.model", unigram_spec(true).proto()));
  ASSERT_EQ(dlm::data::tok::sentencepiece_encoder(*b), "native unigram");
  EXPECT_EQ(b->encode("x\u2603"), (Ids{x + 256, 3 + 0xE2, 3 + 0x98, 3 + 0x83}));
  EXPECT_EQ(b->decode(b->encode("x\u2603 xx")), "x\u2603 xx");

  // Without a piece that holds U+2581, an escaped space or a literal U+2581 is unknown and falls back
  // to its three bytes (the lattice sees U+2581 as one byte, SentencePieceNormalizer::space_byte).
  Spec no_space = unigram_spec(true);
  std::erase_if(no_space.pieces, [](const Spec::Piece& p) { return p.text.find("\u2581") != std::string::npos; });
  const auto n = load(m.write("no_space.model", no_space.proto()));
  ASSERT_EQ(dlm::data::tok::sentencepiece_encoder(*n), "native unigram");
  const Ids spelled = {3 + 0xE2, 3 + 0x96, 3 + 0x81};
  Ids want = {x + 256};
  for (int k = 0; k < 2; ++k) want.insert(want.end(), spelled.begin(), spelled.end());
  want.push_back(x + 256);
  EXPECT_EQ(n->encode("x \u2581x"), want);
}

// A text of 256 bytes or more is followed back in up to four stretches side by side, cut at space
// bytes (the model has "\u2581" alone and no piece holds it past its first byte): unknown nodes in
// every stretch, right before a cut too, come out as in one stretch. The scores add up exactly in
// float, so each word's ids are the same wherever it stands.
TEST(SentencePiece, UnigramLongTextStretches) {
  Models m;
  const std::int32_t x = 3, y = 5, sp_x = 8;
  std::string text;
  Ids plain, bytes;
  for (int k = 0; k < 60; ++k) {
    text += " x\u2603\u2603 xy";
    plain.insert(plain.end(), {sp_x, 0, sp_x, y});
    bytes.insert(bytes.end(), {sp_x + 256, 3 + 0xE2, 3 + 0x98, 3 + 0x83, 3 + 0xE2, 3 + 0x98, 3 + 0x83, sp_x + 256, y + 256});
  }
  const auto t = load(m.write("unigram.model", unigram_spec(false).proto()));
  EXPECT_EQ(t->encode(text), plain);
  const auto b = load(m.write("bytes.model", unigram_spec(true).proto()));
  EXPECT_EQ(b->encode(text), bytes);
  // No unknown node at all: the stretches' ids go out as they are.
  std::string known;
  Ids want;
  for (int k = 0; k < 60; ++k) known += " xxx xy", want.insert(want.end(), {sp_x, x + 1, sp_x, y});
  EXPECT_EQ(t->encode(known), want);
}

// Decoding is native (sentencepiece_decoder.h). The expected text is what Python sentencepiece 0.2.3
// decodes for the same hand-written models.
TEST(SentencePiece, DecodeAsPythonSentencepiece) {
  Models m;
  const auto b = [](int byte) { return 3 + byte; };
  const std::int32_t unk = 0, bos = 1, eos = 2, sp = 259, a = 260, sp_a = 263, sp_ab = 266, sp_sp = 267, x = 270;
  const std::vector<Ids> ids = {{sp_a, sp_ab}, {sp, sp_a}, {bos, sp_a}, {unk, sp_a},
                                {b(0xE2), b(0x98), b(0x83), a}, {b(0xE2), b(0x98), a}, {b(0x20), sp_a}, {sp_sp, sp_a},
                                {x, sp}, {eos, sp, sp, sp_a}, {b(0xEF), b(0xBF), b(0xBD)}, {b(0xC0), b(0x80)}, {}};
  auto decode_all = [&](const Spec& spec, const char* name) {
    const auto t = load(m.write(name, spec.proto()));
    EXPECT_EQ(dlm::data::tok::sentencepiece_decoder(*t), "native");
    std::vector<std::string> out;
    for (const auto& v : ids) out.push_back(t->decode(v));
    return out;
  };
  // The first piece loses its U+2581 (dummy prefix); one that loses it ends the leading run, a
  // control piece does not. Byte pieces spell UTF-8; each byte of an ill-formed sequence is one U+FFFD
  // (E2 98: two, where Python's "replace" would write one).
  const std::string fffd = "\ufffd";
  Spec spec = tiny();
  EXPECT_EQ(decode_all(spec, "default.model"),
            (std::vector<std::string>{"a ab", " a", "a", " \u2047  a", "\u2603a", fffd + fffd + "a", "  a", "  a", "[X] ",
                                      "  a", fffd, fffd + fffd, ""}));
  // remove_extra_whitespaces: every leading piece loses one U+2581.
  spec.remove_extra_whitespaces = true;
  EXPECT_EQ(decode_all(spec, "remove_extra.model"),
            (std::vector<std::string>{"a ab", "a", "a", " \u2047  a", "\u2603a", fffd + fffd + "a", "  a", "  a", "[X] ",
                                      "a", fffd, fffd + fffd, ""}));
  // Neither flag: nothing is dropped.
  spec.remove_extra_whitespaces = false;
  spec.add_dummy_prefix = false;
  EXPECT_EQ(decode_all(spec, "no_dummy.model"),
            (std::vector<std::string>{" a ab", "  a", " a", " \u2047  a", "\u2603a", fffd + fffd + "a", "  a", "   a",
                                      "[X] ", "   a", fffd, fffd + fffd, ""}));
  spec = tiny();
  spec.unk_surface = "<?>";
  EXPECT_EQ(decode_all(spec, "surface.model")[3], "<?> a");
  EXPECT_THROW(load(m.write("d.model", tiny().proto()))->decode(Ids{271}), dlm::Error);
}

TEST(SentencePiece, ShippedUnigramModelsAsPythonSentencepiece) {
  const auto data = fs::path(DLM_SOURCE_DIR) / "tests" / "tokenize" / "data";
  const auto en = load((data / "botchan_en_unigram_1000.model").string());
  ASSERT_EQ(dlm::data::tok::sentencepiece_encoder(*en), "native unigram");
  EXPECT_EQ(en->encode("I saw a girl with a telescope."), (Ids{9, 459, 11, 939, 44, 11, 4, 142, 82, 8, 28, 21, 132, 6}));
  // nfkc: full-width letters and the fi ligature fold; tabs stay and are unknown; spaces collapse.
  EXPECT_EQ(en->encode("  \uff21\uff22C  \ufb01ne\t\tdone  "), (Ids{104, 540, 381, 706, 0, 17, 112, 16}));
  EXPECT_EQ(en->encode("caf\u00e9 \u2603\u2603 x"), (Ids{78, 19, 57, 0, 4, 0, 4, 297}));
  // "-" + "--" and "--" + "-" score the same: 0.2.3 keeps the first offer (libsentencepiece 0.1.97
  // gives "--" "-" here, the difference issue 31 is about).
  EXPECT_EQ(en->encode("a---b"), (Ids{11, 35, 415, 66}));
  EXPECT_EQ(en->encode("---"), (Ids{4, 35, 415}));
  const auto ja = load((data / "kyoto_ja_unigram_8000.model").string());
  ASSERT_EQ(dlm::data::tok::sentencepiece_encoder(*ja), "native unigram");
  EXPECT_EQ(ja->encode("\u543e\u8f29\u306f\u732b\u3067\u3042\u308b\u3002\u540d\u524d\u306f\u307e\u3060\u7121\u3044\u3002"),
            (Ids{6, 3973, 6019, 9, 6022, 24, 5, 1606, 9, 2206, 2441, 5}));
  EXPECT_EQ(ja->encode("\uff71\uff72\uff73 123"), (Ids{6, 4588, 491, 1847, 33}));  // half-width kana fold
}

// sentencepiece_fuzz: a charsmap whose rule points past its replacement text made libsentencepiece
// 0.1.97 read out of bounds (strlen in Normalizer::NormalizePrefix). Such a model is refused, as is
// one whose trie leads outside itself; a well-formed charsmap of the same shape is taken.
TEST(SentencePiece, MalformedCharsmapIsAnError) {
  Models m;
  // <u32 trie bytes><256 Darts-clone units><text>: unit 0 is the root (offset 0), unit 0x61 the node
  // for 'a' (label 0x61, has-leaf bit 8, offset 0), so its value unit is itself.
  auto charsmap = [](std::uint32_t root) {
    std::vector<std::uint32_t> units(256);
    units[0] = root;
    units[0x61] = 0x61 | 1u << 8;
    std::string blob(4 + 4 * units.size(), '\0');
    const std::uint32_t bytes = 4 * static_cast<std::uint32_t>(units.size());
    std::memcpy(blob.data(), &bytes, 4);
    std::memcpy(blob.data() + 4, units.data(), bytes);
    return blob + std::string("b\0", 2);
  };
  auto fails = [&](const std::string& name, const std::string& blob, const std::string& what) {
    auto s = tiny();
    s.model_type = 1;
    s.charsmap = blob;
    const auto path = m.write(name, s.proto());
    try {
      load(path);
      ADD_FAILURE() << name << " loaded";
    } catch (const dlm::Error& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": not a SentencePiece model"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // The value unit for 'a' is the node unit itself: value 0x161 lies past the 2-byte text.
  fails("value.model", charsmap(0), "points outside its text");
  fails("trie.model", charsmap(4096u << 10), "leads outside its trie");
  fails("sizes.model", charsmap(0).substr(0, 100), "");  // libsentencepiece refuses this one itself
}
