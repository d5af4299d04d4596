// dlm-train and dlm-generate on the GPU (--device cuda) as a user runs them: the losses of a tiny
// diffusion model follow the CPU run's from the same seed (the GPU draws Model::init's weights and the
// same noise; bf16 activations make the difference), a GPU run saved and resumed continues the straight
// run, and its checkpoint (libckpt's native format) continues on the CPU and samples on the GPU.
// The tools' paths can be overridden (DLM_TRAIN_TOOL, DLM_GENERATE_TOOL) where the binaries were carried.
#include <cmath>
#include <cstdlib>

#include "dlm/train/device.h"
#include "tool_fixture.h"

namespace fs = std::filesystem;

namespace dlm::test {
namespace {

std::string tool(const char* env, const std::string& built) {
  const char* e = std::getenv(env);
  return e && *e ? std::string(e) : built;
}

class GpuTool : public ToolTest {
 protected:
  void SetUp() override {
    if (!train::cuda_present()) GTEST_SKIP() << "no CUDA device";
    // cuDNN's default attention backward accumulates with atomics; the resume test wants one run's numbers.
    ::setenv("DLM_CUDA_DETERMINISTIC", "1", 1);
    ToolTest::SetUp();
  }
  // The fixture's model with a head dimension the GPU runs (16) and the device chosen.
  std::vector<std::string> argv_on(const std::string& device, std::vector<std::string> extra) const {
    extra.insert(extra.end(), {"--hidden-size", "64", "--ffn-hidden-size", "128", "--device", device});
    auto a = train_argv(extra);
    a[0] = tool("DLM_TRAIN_TOOL", kTrainTool);
    return a;
  }
  static std::vector<double> numbers(const std::vector<std::string>& text) {
    std::vector<double> out;
    for (const auto& t : text) out.push_back(std::stod(t));
    return out;
  }
};

TEST_F(GpuTool, LossesFollowTheCpuRun) {
  const auto cpu = dir_ / "cpu.jsonl", gpu = dir_ / "gpu.jsonl";
  auto r = run(argv_on("cpu", {"--train-iters", "12", "--metrics-file", cpu.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(argv_on("cuda", {"--train-iters", "12", "--metrics-file", gpu.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("on the GPU"), std::string::npos) << r.err;
  const auto want = numbers(losses(cpu)), got = numbers(losses(gpu));
  ASSERT_EQ(want.size(), 12u);
  ASSERT_EQ(got.size(), 12u);
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double rel = std::abs(got[i] - want[i]) / std::abs(want[i]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 2e-2) << "iteration " << i + 1 << ": cpu " << want[i] << " gpu " << got[i];
  }
  std::printf("[gpu tool] 12 iterations: worst relative loss difference GPU vs CPU %.3g (first %.6f / %.6f, last %.6f / %.6f)\n",
              worst, want.front(), got.front(), want.back(), got.back());
}

TEST_F(GpuTool, SaveResumeContinuesTheRunAndTheCheckpointRunsOnTheCpu) {
  const auto straight = dir_ / "straight.jsonl", first = dir_ / "first.jsonl", second = dir_ / "second.jsonl";
  const auto ckpt = (dir_ / "ckpt").string();
  auto r = run(argv_on("cuda", {"--train-iters", "8", "--metrics-file", straight.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(argv_on("cuda", {"--train-iters", "8", "--save", ckpt, "--exit-interval", "4", "--metrics-file", first.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(dir_ / "ckpt" / "iter_0000004" / "metadata.json"));
  r = run(argv_on("cuda", {"--train-iters", "8", "--load", ckpt, "--save", ckpt, "--metrics-file", second.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto got = losses(first);
  for (const auto& l : losses(second)) got.push_back(l);
  const auto want = losses(straight);
  ASSERT_EQ(got.size(), want.size());
  const auto g = numbers(got), w = numbers(want);
  for (std::size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-6 * std::abs(w[i])) << "iteration " << i + 1;
  std::printf("[gpu tool] resumed GPU run %s the straight run\n", got == want ? "is bit-identical to" : "differs slightly from");

  // The GPU's iteration-4 checkpoint continued on the CPU: the same run up to bf16 noise.
  const auto on_cpu = dir_ / "cpu.jsonl";
  r = run(argv_on("cpu", {"--train-iters", "8", "--load", (dir_ / "ckpt" / "iter_0000004").string(), "--metrics-file",
                          on_cpu.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto c = numbers(losses(on_cpu));
  ASSERT_EQ(c.size(), 4u);
  for (std::size_t i = 0; i < c.size(); ++i) EXPECT_NEAR(c[i], w[4 + i], 2e-2 * std::abs(w[4 + i])) << "iteration " << 5 + i;

  // Sampling from the final GPU checkpoint on the GPU and on the CPU.
  const auto sample = [&](const std::string& device) {
    const auto out = dir_ / ("sample-" + device + ".txt");
    const std::string cmd = "'" + tool("DLM_GENERATE_TOOL", kGenerateTool) + "' --load '" + ckpt +
                            "' --tokenizer-type NullTokenizer --tokenizer-model none --vocab-size 200 --threads 1"
                            " --prompt '5 12 19' --prompt '7' --max-new-tokens 16 --sample-steps 16"
                            " --inference-block-size 8 --device " + device + " > '" + out.string() + "'";
    const auto s = dlm::test::run({"/bin/sh", "-c", cmd}, (dir_ / "gen.err").string());
    EXPECT_EQ(s.exit_code, 0) << s.err;
    std::ifstream in(out);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const std::string on_gpu = sample("cuda"), on_host = sample("cpu");
  EXPECT_FALSE(on_gpu.empty());
  std::printf("[gpu tool] sampled on the GPU:\n%s[gpu tool] on the CPU:\n%s", on_gpu.c_str(), on_host.c_str());
}

}  // namespace
}  // namespace dlm::test
