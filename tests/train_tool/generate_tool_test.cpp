// dlm-generate as a user runs it: from a dlm-train checkpoint and from its Hugging Face export (the same
// text for the same seed), deterministic in --seed, and one-line errors for what cannot be opened.
#include <regex>

#include "tool_fixture.h"

namespace fs = std::filesystem;

namespace dlm::test {
namespace {

class GenerateTool : public ToolTest {
 protected:
  void SetUp() override {
    ToolTest::SetUp();
    ckpt_ = (dir_ / "ckpt").string();
    const auto r = run(train_argv({"--train-iters", "20", "--save", ckpt_}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  // stdout of a dlm-generate run (the generated lines).
  std::string generate(const std::string& model, std::vector<std::string> extra, int* exit_code = nullptr) const {
    const auto out = dir_ / "out.txt";
    std::vector<std::string> argv = {"/bin/sh", "-c", ""};
    std::string cmd = "'" + kGenerateTool + "' --load '" + model +
                      "' --tokenizer-type NullTokenizer --tokenizer-model none --vocab-size 200 --threads 1 --device cpu";
    for (const auto& e : extra) cmd += " '" + e + "'";
    argv[2] = cmd + " > '" + out.string() + "'";
    const auto r = dlm::test::run(argv, (dir_ / "gen.err").string());
    if (exit_code) *exit_code = r.exit_code;
    else EXPECT_EQ(r.exit_code, 0) << r.err;
    return read_all(out);
  }
  std::string ckpt_;
};

TEST_F(GenerateTool, DiffusionSamplingIsDeterministicAndEqualFromTheHfExport) {
  const std::vector<std::string> flags = {"--prompt", "5 12 19", "--max-new-tokens", "16", "--sample-steps", "8",
                                          "--inference-block-size", "8", "--temperature", "1", "--seed", "3"};
  const std::string a = generate(ckpt_, flags), b = generate(ckpt_, flags);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.rfind("5 12 19", 0), 0u) << a;  // the prompt, then the generated ids
  EXPECT_GT(a.size(), std::string("5 12 19\n").size()) << a;

  const auto hf = (dir_ / "hf").string();
  const auto r = run({kCkptTool, "convert", "--from", "native", "--to", "hf", "--dtype", "fp32", ckpt_, hf});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(generate(hf, flags), a);
}

TEST_F(GenerateTool, AutoregressiveModeAndRandomRemaskingRun) {
  const std::string ar = generate(ckpt_, {"--prompt", "5 12", "--mode", "ar", "--max-new-tokens", "6", "--top-k", "5",
                                          "--temperature", "0.8", "--seed", "1"});
  EXPECT_EQ(ar.rfind("5 12", 0), 0u) << ar;
  const std::string rnd = generate(ckpt_, {"--prompt", "5", "--remasking", "random", "--max-new-tokens", "8", "--seed", "2"});
  EXPECT_EQ(rnd.rfind("5", 0), 0u) << rnd;
}

// --kv-cache with a full forward every step is the exact sampler; with the default refresh (each block's
// start) it decodes every block from the cached windows. Two prompts of different lengths in one batch.
TEST_F(GenerateTool, KvCacheRefreshedEveryStepIsTheExactSampler) {
  const std::vector<std::string> flags = {"--prompt", "5 12 19", "--prompt", "7", "--max-new-tokens", "16",
                                          "--sample-steps", "16", "--inference-block-size", "8", "--temperature",
                                          "1", "--seed", "3", "--no-eos-stop"};
  const std::string exact = generate(ckpt_, flags);
  for (const char* mode : {"prefix", "dual"}) {
    auto cached = flags;
    cached.insert(cached.end(), {"--kv-cache", mode, "--cache-refresh", "1"});
    EXPECT_EQ(generate(ckpt_, cached), exact) << mode;
    cached.back() = "0";
    const std::string approximate = generate(ckpt_, cached);
    EXPECT_EQ(approximate.rfind("5 12 19", 0), 0u) << approximate;
    EXPECT_EQ(std::count(approximate.begin(), approximate.end(), '\n'), 2) << approximate;
  }
  int code = 0;
  auto bad = flags;
  bad.insert(bad.end(), {"--kv-cache", "suffix"});
  generate(ckpt_, bad, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(read_all(dir_ / "gen.err").find("--kv-cache suffix: expected none, prefix or dual"), std::string::npos);
}

// --report-speed samples twice and times the second run: the same text, and one stderr line whose forwards are
// the steps (the exact sampler) or fewer (parallel decoding ends a block early only when it can).
TEST_F(GenerateTool, ReportSpeedKeepsTheTextAndCountsForwards) {
  const std::vector<std::string> flags = {"--prompt", "5 12 19", "--prompt", "7 8 9", "--max-new-tokens", "16",
                                          "--sample-steps", "16", "--inference-block-size", "8", "--no-eos-stop"};
  const std::regex speed(R"(dlm-generate: speed: 2 rows, 32 tokens in [0-9.]+ s, [0-9.]+ tokens/s, (\d+) forwards)");
  for (const char* mode : {"none", "dual"}) {
    auto timed = flags;
    timed.insert(timed.end(), {"--kv-cache", mode});
    const std::string plain = generate(ckpt_, timed);
    timed.push_back("--report-speed");
    EXPECT_EQ(generate(ckpt_, timed), plain) << mode;
    std::smatch m;
    const std::string err = read_all(dir_ / "gen.err");
    ASSERT_TRUE(std::regex_search(err, m, speed)) << err;
    EXPECT_EQ(m[1], "16") << mode;
    timed.insert(timed.end(), {"--threshold", "0.5"});
    generate(ckpt_, timed);
    const std::string fewer = read_all(dir_ / "gen.err");
    ASSERT_TRUE(std::regex_search(fewer, m, speed)) << fewer;
    EXPECT_GE(std::stoi(m[1]), 2) << mode;  // at least one forward per block
    EXPECT_LE(std::stoi(m[1]), 16) << mode;
  }
}

// --fp8 is the GPU's (CudaOptions::fp8_sampling): with --device cpu a usage error of one line, nothing sampled.
TEST_F(GenerateTool, Fp8OnTheCpuIsAUsageError) {
  int code = 0;
  const std::string out = generate(ckpt_, {"--prompt", "5 12", "--max-new-tokens", "4", "--fp8"}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_EQ(out, "");
  const std::string err = read_all(dir_ / "gen.err");
  EXPECT_EQ(err.rfind("dlm-generate: --fp8: the CPU backend has no FP8 GEMMs (sample in FP8 with --device cuda)\n", 0),
            0u) << err;
}

TEST_F(GenerateTool, AMissingCheckpointIsOneLine) {
  const auto r = run({kGenerateTool, "--load", (dir_ / "nothing").string(), "--tokenizer-type", "NullTokenizer",
                      "--tokenizer-model", "none", "--vocab-size", "200", "--prompt", "1 2"});
  const std::string line = last_error_line(r, "dlm-generate");
  EXPECT_NE(line.find("nothing"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dlm::test
