// The hardened data cases against the real tools: a crafted .idx, negative ids and an invalid merge input are
// one-line errors (exit 1, no signal) from every reader, and leave no output behind.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <gtest/gtest.h>

#include "child.h"
#include "dlm/data/indexed_dataset.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

const std::string kPreprocess = DLM_PREPROCESS_TOOL;
const std::string kBlend = DLM_BLEND_TOOL;
const std::string kTrain = DLM_TRAIN_TOOL;

// 40 documents of 50 ids below 1000; `negative` puts one -5 in the middle.
std::string make_dataset(const fs::path& dir, dlm::data::DType dtype, bool negative = false) {
  const std::string prefix = (dir / "data").string();
  dlm::data::IndexedDatasetWriter w(prefix, dtype);
  for (int d = 0; d < 40; ++d) {
    std::vector<std::int32_t> ids(50);
    for (int i = 0; i < 50; ++i) ids[i] = (d * 50 + i) % 997;
    if (negative && d == 20) ids[7] = -5;
    w.add_item(ids);
    w.end_document();
  }
  w.finalize();
  return prefix;
}

void patch(const std::string& path, std::size_t offset, std::int64_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(&value), sizeof value);
}

std::vector<std::string> train_argv(const std::string& prefix, const fs::path& dir) {
  return {kTrain, "--num-layers", "1", "--hidden-size", "32", "--ffn-hidden-size", "64", "--num-attention-heads", "4",
          "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "1",
          "--vocab-size", "1000", "--mask-token", "999", "--data-path", prefix, "--split", "100,0,0",
          "--data-cache-path", (dir / "cache").string(), "--threads", "1"};
}

std::vector<std::string> blend_argv(const std::string& command, const std::string& prefix, const fs::path& dir) {
  std::vector<std::string> a{kBlend, command};
  if (command == "sample") a.push_back("0");
  // std::strings, not c_str() pointers: a pointer into the temporary path would dangle inside the loop.
  const std::vector<std::string> flags{"--data-path", prefix, "--split", "100,0,0", "--seq-length", "16",
                                       "--train-samples", "10", "--global-batch-size", "2", "--data-cache-path",
                                       (dir / "cache").string()};
  a.insert(a.end(), flags.begin(), flags.end());
  return a;
}

// Exit 1 with one line that starts with the tool's name and contains `expected`.
void expect_one_line_error(const dlm::test::ChildResult& r, const std::string& tool, const std::string& expected) {
  EXPECT_EQ(r.signal, 0) << tool << " crashed: " << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto last = r.err.substr(r.err.rfind('\n', r.err.size() - 2) + 1);
  EXPECT_EQ(last.rfind(tool + ": ", 0), 0u) << r.err;
  EXPECT_NE(last.find(expected), std::string::npos) << "expected '" << expected << "' in: " << r.err;
}

// Case 3: a negative sequence pointer used to crash inspect and dlm-blend sample (SIGSEGV) and pass dlm-blend
// build and dlm-train; every reader now refuses it when the dataset is opened.
TEST(Hardening, CraftedIndexIsOneLineErrorFromEveryReader) {
  const fs::path dir = dlm::ckpt::test::fresh_dir("crafted_idx");
  const std::string prefix = make_dataset(dir, dlm::data::DType::kUInt16);
  patch(prefix + ".idx", 34 + 4 * 40 + 8 * 39, -1000);  // the pointer of sequence 39
  const std::string expected = prefix + ".idx: offset 506: sequence 39 pointer -1000 is not the running sum";
  const std::string err = (dir / "err").string();
  expect_one_line_error(dlm::test::run({kPreprocess, "validate", prefix}, err), "dlm-preprocess", expected);
  expect_one_line_error(dlm::test::run({kPreprocess, "inspect", prefix}, err), "dlm-preprocess", expected);
  expect_one_line_error(dlm::test::run(blend_argv("build", prefix, dir), err), "dlm-blend", expected);
  expect_one_line_error(dlm::test::run(blend_argv("sample", prefix, dir), err), "dlm-blend", expected);
  expect_one_line_error(dlm::test::run(train_argv(prefix, dir), err), "dlm-train", expected);
}

// Case 5: a negative id in an int32 .bin used to be trained as id 0.
TEST(Hardening, NegativeTokenIdsAreRefusedByValidateSampleAndTrain) {
  const fs::path dir = dlm::ckpt::test::fresh_dir("negative_ids");
  const std::string prefix = make_dataset(dir, dlm::data::DType::kInt32, true);
  const std::string err = (dir / "err").string();
  const std::string at = prefix + ".bin: offset " + std::to_string((20 * 50 + 7) * 4) + ": token id -5 is negative";
  expect_one_line_error(dlm::test::run({kPreprocess, "validate", prefix}, err), "dlm-preprocess", at);
  expect_one_line_error(dlm::test::run(train_argv(prefix, dir), err), "dlm-train", at);
}

// Case 11: merging an input that validate refuses exits 1 and writes nothing.
TEST(Hardening, MergeOfAnInvalidInputIsRefusedAndWritesNothing) {
  const fs::path dir = dlm::ckpt::test::fresh_dir("merge_invalid");
  fs::create_directories(dir / "good");
  fs::create_directories(dir / "bad");
  const std::string good = make_dataset(dir / "good", dlm::data::DType::kInt32);
  const std::string bad = make_dataset(dir / "bad", dlm::data::DType::kInt32, true);
  const std::string out = (dir / "merged").string();
  const auto r = dlm::test::run({kPreprocess, "merge", "--input", good, bad, "--output-prefix", out}, (dir / "err").string());
  expect_one_line_error(r, "dlm-preprocess", "token id -5 is negative");
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find("merged"), std::string::npos) << "left behind: " << e.path();
}

// Case 17: --save D --load D on a first run (D missing, or an empty folder) starts fresh, as Megatron does,
// and a second run resumes from what the first saved.
TEST(Hardening, SaveAndLoadTheSameFolderOnAFirstRunStartsFresh) {
  const fs::path dir = dlm::ckpt::test::fresh_dir("save_load_same");
  const std::string prefix = make_dataset(dir, dlm::data::DType::kUInt16);
  for (const fs::path ckpt : {dir / "missing", dir / "empty"}) {
    if (ckpt.filename() == "empty") fs::create_directories(ckpt);
    auto argv = train_argv(prefix, dir);
    for (const std::string a : {"--save", ckpt.c_str(), "--load", ckpt.c_str()}) argv.push_back(a);
    auto r = dlm::test::run(argv, (dir / "err").string());
    EXPECT_EQ(r.exit_code, 0) << ckpt << ": " << r.err;
    EXPECT_EQ(dlm::test::read_all(ckpt / "latest"), "iter_0000001\n") << ckpt;
    argv[std::find(argv.begin(), argv.end(), "--train-iters") - argv.begin() + 1] = "2";
    r = dlm::test::run(argv, (dir / "err").string());
    EXPECT_EQ(r.exit_code, 0) << ckpt << ": " << r.err;
    EXPECT_EQ(dlm::test::read_all(ckpt / "latest"), "iter_0000002\n") << ckpt;
  }
}

// Case 15: a non-finite step without --save used to claim "stopped with a checkpoint of iteration N".
// Weights of std 1e6 and a learning rate of 1e6 overflow within a few steps.
TEST(Hardening, NonFiniteStopWithoutSaveClaimsNoCheckpoint) {
  const fs::path dir = dlm::ckpt::test::fresh_dir("nan_no_save");
  const std::string prefix = make_dataset(dir, dlm::data::DType::kUInt16);
  auto argv = train_argv(prefix, dir);
  argv[std::find(argv.begin(), argv.end(), "--train-iters") - argv.begin() + 1] = "4";
  for (const std::string a : {"--init-method-std", "1000000", "--lr", "1000000", "--clip-grad", "0"}) argv.push_back(a);
  const auto r = dlm::test::run(argv, (dir / "err").string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("is not finite; stopped (lower --lr"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("with a checkpoint"), std::string::npos) << r.err;
}

// Case 16: a key given twice is a usage error naming it (it said 'missing key "text"').
TEST(Hardening, JsonKeyGivenTwiceIsAUsageError) {
  const fs::path dir = dlm::ckpt::test::fresh_dir("json_keys_twice");
  std::ofstream(dir / "in.jsonl") << "{\"text\": \"ab\"}\n";
  const std::string tokenizer = std::string(DLM_SOURCE_DIR) + "/tests/fuzz/corpus/tokenizer_json/bytelevel.json";
  const auto r = dlm::test::run({kPreprocess, "--input", (dir / "in.jsonl").string(), "--output-prefix", (dir / "out").string(),
                                 "--json-keys", "text", "text", "--tokenizer-type", "HuggingFaceTokenizer",
                                 "--tokenizer-model", tokenizer},
                                (dir / "err").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, "dlm-preprocess: --json-keys: \"text\" is given twice (each key names its own output)\n");
  EXPECT_EQ(dlm::test::names_in(dir), (std::vector<std::string>{"err", "in.jsonl"}));
}

// A PID that no process has (a child that has exited and been reaped).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// Case 19: temporaries a SIGKILLed dlm-preprocess or dlm-blend left are removed by the next run; those of
// a live process, or locked by a writer (another machine's, whose PID means nothing here), are kept.
TEST(Hardening, StaleTemporariesOfADeadRunAreRemovedByTheNextRun) {
  const fs::path dir = dlm::ckpt::test::fresh_dir("stale_tmp");
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getpid());
  auto plant = [](const fs::path& folder, const std::string& name) {
    fs::create_directories(folder);
    std::ofstream(folder / name) << "partial";
  };
  const fs::path out = dir / "out", cache = dir / "cache";
  plant(out, ".corpus_text_document.bin.tmp." + dead + ".0");
  plant(out, ".other.idx.tmp." + dead + ".3");
  plant(out, ".mine.bin.tmp." + live + ".0");
  plant(out, ".locked.bin.tmp." + dead + ".1");
  plant(out, "notes.tmp." + dead + ".0");  // not a temporary's name
  const int locked = ::open((out / (".locked.bin.tmp." + dead + ".1")).c_str(), O_RDONLY);
  ASSERT_EQ(::flock(locked, LOCK_EX), 0);
  std::ofstream(dir / "corpus.jsonl") << "{\"text\": \"ab ab a b\"}\n{\"text\": \"ba\"}\n";
  const std::string tokenizer = std::string(DLM_SOURCE_DIR) + "/tests/fuzz/corpus/tokenizer_json/bytelevel.json";
  auto r = dlm::test::run({kPreprocess, "--input", (dir / "corpus.jsonl").string(), "--output-prefix", (out / "corpus").string(),
                           "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer, "--workers", "1"},
                          (dir / "err").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto names = dlm::test::names_in(out);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".locked.bin.tmp." + dead + ".1", ".mine.bin.tmp." + live + ".0",
                                             "corpus_text_document.bin", "corpus_text_document.idx", "notes.tmp." + dead + ".0"}));
  ::close(locked);
  // dlm-blend's cache folder.
  const std::string prefix = make_dataset(dir, dlm::data::DType::kUInt16);
  plant(cache, ".abc-GPTDataset-train-shuffle_index.npy.tmp." + dead + ".2");
  r = dlm::test::run({kBlend, "build", "--data-path", prefix, "--split", "100,0,0", "--seq-length", "16", "--train-samples",
                      "10", "--global-batch-size", "2", "--data-cache-path", cache.string()},
                     (dir / "err").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& name : dlm::test::names_in(cache)) EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
}

}  // namespace
