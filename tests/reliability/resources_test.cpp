// Resources: a very long JSONL line, a document of many tokens, a blend of many datasets, each through
// the real tools with the child's peak RSS (wait4's ru_maxrss) asserted against a bound; and an
// address-space limit (RLIMIT_AS) too small for the work, which must end in one line and no output.
//
// The cases run scaled down by default (a 64 MiB line, 10M tokens, 2,000 datasets: seconds, under
// 1 GB). DLM_RESOURCES_BIG=1 runs the full sizes (a 1 GiB line and a line past the 4 GiB
// maximum, 100M tokens, 10,000 datasets: minutes, ~10 GB of memory and disk); numbers in
// docs/reliability.md.
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../common/sanitized.h"
#include "dlm/common/error.h"
#include "dlm/data/indexed_dataset.h"
#include "dlm/data/jsonl.h"
#include "dlm/data/npy.h"
#include "dlm/data/tokenizer.h"

namespace fs = std::filesystem;

namespace {

const std::string kPreprocess = DLM_PREPROCESS_TOOL;
const std::string kBlend = DLM_BLEND_TOOL;
constexpr double kMiB = 1024.0 * 1024.0;

// Under ASan/TSan RSS bounds and RLIMIT_AS say nothing (sanitized.h): those checks are for plain builds.
using dlm::test::kSanitized;

bool big() {
  const char* v = std::getenv("DLM_RESOURCES_BIG");
  return v != nullptr && std::string(v) == "1";
}

fs::path fresh(const std::string& tag) {
  const char* tmp = std::getenv("DLM_RESOURCES_TMP");  // big cases want a roomy disk
  const fs::path base = tmp != nullptr ? fs::path(tmp) : fs::temp_directory_path();
  const fs::path d = base / ("dlm_res_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Measured {
  int exit_code = -1;  // -1: killed by a signal
  int signal = 0;
  std::string out, err;
  double peak_rss = 0;  // bytes
  double seconds = 0;
};

// Runs argv as a child (stdout and stderr to files), optionally under RLIMIT_AS = `address_space`.
// ru_maxrss keeps the forked copy's high-water mark across exec, so the tests call this while their
// own memory is small (inputs written, and big buffers freed, before).
Measured run(const std::vector<std::string>& argv, const fs::path& dir, rlim_t address_space = 0) {
  const fs::path out = dir / "child.out", err = dir / "child.err";
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
    ::dup2(::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
    if (address_space) {
      const rlimit r{address_space, address_space};
      ::setrlimit(RLIMIT_AS, &r);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  rusage usage{};
  ::wait4(pid, &status, 0, &usage);
  Measured m;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.peak_rss = static_cast<double>(usage.ru_maxrss) * 1024.0;
  if (WIFEXITED(status)) m.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) m.signal = WTERMSIG(status);
  m.out = read_file(out);
  m.err = read_file(err);
  return m;
}

void report(const std::string& what, const Measured& m) {
  std::printf("[resources] %s: %.1f s, peak RSS %.1f MiB\n", what.c_str(), m.seconds, m.peak_rss / kMiB);
  std::fflush(stdout);
}

std::size_t lines_in(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

// ---------------------------------------------------------------------------------------- long lines

// GPT-2's byte -> printable code point table, as tokenizer.json files store byte-level tokens.
std::vector<char32_t> byte_level_alphabet() {
  std::vector<char32_t> table(256);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

std::string json_escape_cp(char32_t c) { return fmt::format("\\u{:04x}", static_cast<unsigned>(c)); }

// A byte-level BPE tokenizer.json: every byte is a token, a few English merges on top, so real text
// goes through the GPT-2 pre-tokenizer regex and the BPE model at ~0.9 ids per byte.
fs::path write_tokenizer(const fs::path& dir) {
  const auto alpha = byte_level_alphabet();
  std::string vocab, merges;
  std::size_t id = 0;
  for (int b = 0; b < 256; ++b) vocab += fmt::format("{}\"{}\": {}", id ? ", " : "", json_escape_cp(alpha[b]), id), ++id;
  const char* pairs[][2] = {{"t", "h"}, {"i", "n"}, {"e", "r"}, {"a", "n"}, {"r", "e"}, {"o", "n"}, {"e", "n"},
                            {"a", "t"}, {"o", "r"}, {"th", "e"}, {"s", "t"}, {"e", "s"}, {"i", "s"}, {"a", "l"}};
  for (const auto& p : pairs) {
    vocab += fmt::format(", \"{}{}\": {}", p[0], p[1], id++);
    merges += fmt::format("{}\"{} {}\"", merges.empty() ? "" : ", ", p[0], p[1]);
  }
  const std::string eot = fmt::format("{}", id);
  vocab += ", \"<|endoftext|>\": " + eot;
  const fs::path path = dir / "tokenizer.json";
  std::ofstream(path) << R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [{"id": )" << eot
                      << R"(, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false, )"
                      << R"("normalized": false, "special": true}], "normalizer": null, "pre_tokenizer": {"type": )"
                      << R"("ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}, )"
                      << R"("post_processor": null, "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", )"
                      << R"("dropout": null, "unk_token": null, "fuse_unk": false, "byte_fallback": false, "vocab": {)"
                      << vocab << "}, \"merges\": [" << merges << "]}}";
  return path;
}

// Real text: dlm's own sources, back to back, repeated up to `bytes`.
std::string source_text(std::size_t bytes) {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(std::string(DLM_SOURCE_DIR) + "/libdata"))
    if (e.is_regular_file() && (e.path().extension() == ".cpp" || e.path().extension() == ".h")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string all;
  for (const auto& f : files) all += read_file(f);
  std::string text;
  text.reserve(bytes);
  while (text.size() < bytes) text.append(all, 0, std::min(all.size(), bytes - text.size()));
  return text;
}

// One JSONL line {"text": TEXT}; returns the line's size with its '\n'.
std::size_t write_line(std::ofstream& out, const std::string& text) {
  std::string buf = "{\"text\": \"";
  std::size_t written = 0;
  for (const unsigned char c : text) {
    if (c == '"' || c == '\\') buf += '\\', buf += static_cast<char>(c);
    else if (c == '\n') buf += "\\n";
    else if (c < 0x20) buf += fmt::format("\\u{:04x}", c);
    else buf += static_cast<char>(c);
    if (buf.size() > (1 << 20)) out << buf, written += buf.size(), buf.clear();
  }
  buf += "\"}\n";
  out << buf;
  return written + buf.size();
}

TEST(Resources, LongJsonlLineIsPreprocessedInBoundedMemory) {
  const std::size_t text_bytes = big() ? (std::size_t{1} << 30) : (std::size_t{64} << 20);
  const fs::path dir = fresh("line");
  const fs::path tokenizer = write_tokenizer(dir);
  std::size_t line_bytes = 0;
  {
    std::ofstream out(dir / "in.jsonl", std::ios::binary);
    out << "{\"text\": \"a short first line\"}\n";
    line_bytes = write_line(out, source_text(text_bytes));
    out << "{\"text\": \"and a short last one\"}\n";
  }
  const fs::path prefix = dir / "out";
  const Measured m = run({kPreprocess, "--input", (dir / "in.jsonl").string(), "--output-prefix", prefix.string(),
                          "--json-keys", "text", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                          tokenizer.string(), "--workers", "2"},
                         dir);
  report(fmt::format("dlm-preprocess, a line of {:.0f} MiB", line_bytes / kMiB), m);
  ASSERT_EQ(m.exit_code, 0) << m.err;

  // The same ids as the tokenizer gives on the text itself, in the file's dtype.
  dlm::data::TokenizerOptions options;
  options.type = "HuggingFaceTokenizer";
  options.model = tokenizer.string();
  const auto tok = dlm::data::make_tokenizer(options);
  const dlm::data::IndexedDataset ds(prefix.string() + "_text_document");
  ds.validate();
  ASSERT_EQ(ds.num_documents(), 3u);
  ASSERT_EQ(ds.num_sequences(), 3u);
  std::vector<std::int32_t> want;
  tok->encode(source_text(text_bytes), want);
  const double tokens = static_cast<double>(want.size());
  ASSERT_EQ(ds.sequence_lengths()[1], static_cast<std::int32_t>(want.size()));
  const auto got = ds.sequence_bytes(1);
  ASSERT_EQ(ds.dtype(), dlm::data::DType::kUInt16);
  std::vector<std::uint16_t> narrow(want.begin(), want.end());
  ASSERT_EQ(got.size(), narrow.size() * 2);
  EXPECT_EQ(std::memcmp(got.data(), narrow.data(), got.size()), 0) << "the long line's ids differ from the tokenizer's";
  std::printf("[resources] %.0f ids (%.2f per byte), peak RSS / line = %.2f\n", tokens, tokens / line_bytes,
              m.peak_rss / line_bytes);
  // Held at the peak: the line (a block of up to twice it), its unescaped string (simdjson), the
  // int32 ids (4 bytes each, reserved once), and the threads' and libraries' fixed cost.
  if (!kSanitized) EXPECT_LT(m.peak_rss, 3.5 * line_bytes + 4.5 * tokens + 64 * kMiB);
  if (!kSanitized) EXPECT_LT(m.peak_rss, 8.0 * line_bytes + 64 * kMiB);
  fs::remove_all(dir);
}

TEST(Resources, LineLongerThanTheMaximumIsOneLineErrorNamingFileLine) {
  const fs::path dir = fresh("toolong");
  const fs::path path = dir / "in.jsonl";
  {
    std::ofstream out(path, std::ios::binary);
    out << "{\"text\": \"fine\"}\n{\"text\": \"" << std::string(3 << 20, 'x') << "\"}\n";
  }
  dlm::data::LineBlockReader reader({path.string()}, 64 << 10, 1 << 20);
  dlm::data::LineBlock block;
  try {
    while (reader.next(block)) {
    }
    FAIL() << "a 3 MiB line passed a 1 MiB maximum";
  } catch (const dlm::Error& e) {
    EXPECT_EQ(std::string(e.what()), path.string() + ":2: a line longer than 1048576 bytes: expected at most that "
                                                     "much JSON per line");
  }
  // The block stopped growing at the maximum instead of reading the whole line.
  EXPECT_LT(block.bytes.capacity(), std::size_t{2} << 20);

  if (big()) {
    // The real maximum through the tool: a line past 4 GiB after one good line.
    const fs::path huge = dir / "huge.jsonl";
    {
      std::ofstream out(huge, std::ios::binary);
      out << "{\"text\": \"1 2 3\"}\n{\"text\": \"";  // NullTokenizer's text is ids
      const std::string chunk(1 << 20, '7');
      for (std::size_t n = 0; n < (std::size_t{4} << 30) - 10; n += chunk.size()) out << chunk;
      out << "\"}\n";
    }
    const Measured m = run({kPreprocess, "--input", huge.string(), "--output-prefix", (dir / "out").string(),
                            "--json-keys", "text", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"},
                           dir);
    report("dlm-preprocess, a line past the 4 GiB maximum", m);
    EXPECT_EQ(m.exit_code, 1);
    EXPECT_EQ(m.err, "dlm-preprocess: " + huge.string() +
                         ":2: a line longer than 4294967295 bytes: expected at most that much JSON per line\n");
    if (!kSanitized) EXPECT_LT(m.peak_rss, 7.0 * (std::size_t{4} << 30));
    EXPECT_FALSE(fs::exists(dir / "out_text_document.bin"));
  }
  fs::remove_all(dir);
}

// ------------------------------------------------------------------------------- one long document

// A dataset of one document whose id i is i (int32), so a sample shows where it was cut from.
TEST(Resources, DocumentOfManyTokensIsWrittenValidatedAndSampled) {
  const std::size_t n = big() ? 100'000'000 : 10'000'000;
  const fs::path dir = fresh("doc");
  const std::string prefix = (dir / "doc").string();
  {
    std::vector<std::int32_t> ids(n);
    for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int32_t>(i);
    dlm::data::IndexedDatasetWriter w(prefix, dlm::data::DType::kInt32);
    const std::int32_t length = static_cast<std::int32_t>(n);
    w.add_document(ids, std::span(&length, 1));
    w.finalize();
  }
  const double bin = static_cast<double>(fs::file_size(prefix + ".bin"));
  const Measured v = run({kPreprocess, "validate", prefix}, dir);
  report(fmt::format("dlm-preprocess validate, one document of {} tokens", n), v);
  ASSERT_EQ(v.exit_code, 0) << v.err;
  if (!kSanitized) EXPECT_LT(v.peak_rss, 64 * kMiB) << "validate reads the index, not the tokens";

  const std::size_t seq = 4096, samples = (n - 1) / seq;
  const std::string cache = (dir / "cache").string();
  const std::vector<std::string> flags = {"--data-path", prefix, "--split", "1,0,0", "--seq-length",
                                          std::to_string(seq), "--train-samples", std::to_string(samples),
                                          "--global-batch-size", "1", "--data-cache-path", cache};
  std::vector<std::string> build = {kBlend, "build"};
  build.insert(build.end(), flags.begin(), flags.end());
  const Measured b = run(build, dir);
  report(fmt::format("dlm-blend build, {} samples of {} over it", samples, seq), b);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  if (!kSanitized) EXPECT_LT(b.peak_rss, 64 * kMiB + 0.02 * bin);

  // Every sample of the one epoch is a cut of the document at a multiple of seq, each cut once.
  std::string sample_index, shuffle_index;
  for (const auto& e : fs::directory_iterator(cache)) {
    const std::string f = e.path().string();
    if (f.ends_with("-sample_index.npy")) sample_index = f;
    if (f.ends_with("-shuffle_index.npy")) shuffle_index = f;
  }
  ASSERT_FALSE(sample_index.empty() || shuffle_index.empty()) << "no GPTDataset cache in " << cache;
  const auto cuts = dlm::data::NpyArray::load(sample_index);  // [samples + 1, 2]: (document position, offset)
  const auto shuffle = dlm::data::NpyArray::load(shuffle_index);
  ASSERT_EQ(cuts.size(), 2 * (samples + 1));
  ASSERT_EQ(shuffle.size(), samples);
  std::size_t bad = 0;
  for (std::size_t j = 0; j <= samples; ++j)
    bad += cuts[2 * j] != 0 || cuts[2 * j + 1] != static_cast<std::int64_t>(j * seq);
  EXPECT_EQ(bad, 0u) << "sample_index entries that are not (0, j * seq)";
  std::vector<bool> seen(samples, false);
  for (std::size_t j = 0; j < samples; ++j) {
    const auto k = static_cast<std::size_t>(shuffle[j]);
    ASSERT_LT(k, samples);
    EXPECT_FALSE(seen[k]) << "shuffle_index repeats " << k;
    seen[k] = true;
  }

  // dlm-blend sample: seq consecutive ids (and the labels after them) from where shuffle_index sends it.
  for (const std::size_t j : {std::size_t{0}, samples / 2, samples - 1}) {
    std::vector<std::string> argv = {kBlend, "sample", std::to_string(j)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const Measured s = run(argv, dir);
    ASSERT_EQ(s.exit_code, 0) << s.err;
    if (!kSanitized) EXPECT_LT(s.peak_rss, 64 * kMiB + 0.02 * bin) << "sample " << j;
    const auto at = s.out.find("\ntokens: ");
    ASSERT_NE(at, std::string::npos) << s.out;
    std::istringstream in(s.out.substr(at + 9, s.out.find('\n', at + 1) - at - 9));
    std::vector<std::int64_t> ids{std::istream_iterator<std::int64_t>(in), std::istream_iterator<std::int64_t>()};
    ASSERT_EQ(ids.size(), seq) << "sample " << j;
    const std::int64_t first = shuffle[j] * static_cast<std::int64_t>(seq);
    for (std::size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], first + static_cast<std::int64_t>(i)) << "sample " << j;
    if (j == samples / 2) report(fmt::format("dlm-blend sample {}", j), s);
  }
  fs::remove_all(dir);
}

// ------------------------------------------------------------------------------ many datasets

// `count` datasets of 8 documents (50 to 300 ids) each; weights 1 to 5 in turn.
std::vector<std::string> many_datasets(const fs::path& dir, std::size_t count) {
  std::vector<std::string> words;
  for (std::size_t d = 0; d < count; ++d) {
    const std::string prefix = (dir / fmt::format("ds{:05}", d)).string();
    dlm::data::IndexedDatasetWriter w(prefix, dlm::data::DType::kUInt16);
    for (std::size_t doc = 0; doc < 8; ++doc) {
      std::vector<std::int32_t> ids(50 + (d * 37 + doc * 101) % 251);
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((d * 7 + doc * 13 + i) % 1000);
      const auto length = static_cast<std::int32_t>(ids.size());
      w.add_document(ids, std::span(&length, 1));
    }
    w.finalize();
    words.push_back(std::to_string(1 + d % 5));
    words.push_back(prefix);
  }
  return words;
}

TEST(Resources, BlendOfManyDatasetsBuildsInBoundedMemory) {
  const std::size_t count = big() ? 10'000 : 2'000, samples = count * 8;
  const fs::path dir = fresh("blend");
  const std::vector<std::string> words = many_datasets(dir, count);
  const std::string cache = (dir / "cache").string();
  std::vector<std::string> argv = {kBlend, "build", "--split", "1,0,0", "--seq-length", "64", "--train-samples",
                                   std::to_string(samples), "--global-batch-size", "1", "--data-cache-path", cache,
                                   "--data-path"};
  argv.insert(argv.end(), words.begin(), words.end());
  const Measured m = run(argv, dir);
  report(fmt::format("dlm-blend build, {} datasets, {} samples", count, samples), m);
  ASSERT_EQ(m.exit_code, 0) << m.err;
  // Per dataset: its mapped .idx and three small index arrays, a few pages each, and its description.
  if (!kSanitized) EXPECT_LT(m.peak_rss, 64 * kMiB + count * 48 * 1024.0);

  std::size_t described = 0;
  std::string dataset_index, sample_index;
  for (const auto& e : fs::directory_iterator(cache)) {
    const std::string f = e.path().string();
    described += f.ends_with("-GPTDataset-train-description.txt");
    if (f.ends_with("-BlendedDataset-train-dataset_index.npy")) dataset_index = f;
    if (f.ends_with("-BlendedDataset-train-dataset_sample_index.npy")) sample_index = f;
    EXPECT_EQ(f.find(".tmp"), std::string::npos) << "a temporary left behind: " << f;
  }
  EXPECT_EQ(described, count);
  ASSERT_FALSE(dataset_index.empty() || sample_index.empty());
  // Megatron's blending: entry i takes the next unused sample of its dataset, and each dataset's
  // share stays within one sample of weight * size (helpers.cpp's greedy error argmax).
  const auto which = dlm::data::NpyArray::load(dataset_index);
  const auto nth = dlm::data::NpyArray::load(sample_index);
  const std::size_t size = which.size();  // the train samples asked for, with Megatron's margin
  ASSERT_GE(size, samples);
  ASSERT_EQ(nth.size(), size);
  std::vector<std::int64_t> taken(count, 0);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < size; ++i) {
    const auto d = static_cast<std::size_t>(which[i]);
    ASSERT_LT(d, count);
    bad += nth[i] != taken[d]++;
  }
  EXPECT_EQ(bad, 0u) << "dataset_sample_index entries that are not the dataset's next sample";
  double total = 0;
  for (std::size_t d = 0; d < count; ++d) total += static_cast<double>(1 + d % 5);
  double worst = 0;
  for (std::size_t d = 0; d < count; ++d)
    worst = std::max(worst, std::abs(static_cast<double>(taken[d]) - (1 + d % 5) / total * static_cast<double>(size)));
  EXPECT_LE(worst, 1.0) << "a dataset's share is off its weight by more than a sample";
  fs::remove_all(dir);
}

// ------------------------------------------------------------------------------------ memory limit

TEST(Resources, TooLittleMemoryIsOneLineErrorAndNoOutput) {
  if (kSanitized) GTEST_SKIP() << "sanitizers need more address space than any useful RLIMIT_AS";
  const fs::path dir = fresh("oom");
  const fs::path tokenizer = write_tokenizer(dir);
  {
    std::ofstream out(dir / "in.jsonl", std::ios::binary);
    write_line(out, source_text(std::size_t{64} << 20));
  }
  auto names = [&] {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  };
  const auto before = names();
  // 256 MiB of address space: enough to start, not for a 64 MiB line (its block alone grows to 128 MiB).
  const Measured p = run({kPreprocess, "--input", (dir / "in.jsonl").string(), "--output-prefix",
                          (dir / "out").string(), "--json-keys", "text", "--tokenizer-type", "HuggingFaceTokenizer",
                          "--tokenizer-model", tokenizer.string(), "--workers", "2"},
                         dir, rlim_t{256} << 20);
  EXPECT_EQ(p.exit_code, 1) << p.err;
  EXPECT_EQ(p.err, "dlm-preprocess: out of memory while preprocessing; no output written\n");
  auto after = names();
  std::erase_if(after, [](const std::string& n) { return n.starts_with("child."); });
  EXPECT_EQ(after, before) << "dlm-preprocess left files behind";

  // dlm-blend: 40M samples of a small dataset want ~1 GiB of index arrays.
  const std::string prefix = (dir / "small").string();
  {
    dlm::data::IndexedDatasetWriter w(prefix, dlm::data::DType::kUInt16);
    std::vector<std::int32_t> ids(100'000, 7);
    const std::int32_t length = 100'000;
    w.add_document(ids, std::span(&length, 1));
    w.finalize();
  }
  const fs::path cache = dir / "cache";
  const Measured b = run({kBlend, "build", "--data-path", prefix, "--split", "1,0,0", "--seq-length", "8",
                          "--train-samples", "40000000", "--global-batch-size", "1", "--data-cache-path",
                          cache.string()},
                         dir, rlim_t{256} << 20);
  EXPECT_EQ(b.exit_code, 1) << b.err;
  EXPECT_EQ(lines_in(b.err), 1u) << b.err;
  EXPECT_TRUE(b.err.starts_with("dlm-blend: out of memory while building the indices")) << b.err;
  // What the cache holds is complete: no temporaries, and no .npy without its description.
  for (const auto& e : fs::directory_iterator(cache)) {
    const std::string f = e.path().filename().string();
    EXPECT_FALSE(f.starts_with(".")) << "a temporary left behind: " << f;
  }
  fs::remove_all(dir);
}

}  // namespace
