// dlm-train with Megatron's MoE flags on the CPU backend: a mixture-of-experts model trains, its checkpoint (3-D
// expert tensors, the MoE fields in metadata.json) resumes the very same run, and a refused MoE flag is one line.
#include <fstream>
#include <sstream>

#include "tool_fixture.h"

namespace fs = std::filesystem;

namespace dlm::test {
namespace {

using MoeTrainTool = ToolTest;

const std::vector<std::string> kMoe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16",
                                       "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001",
                                       "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(MoeTrainTool, TrainsAndResumesTheSameRunBitForBit) {
  const auto straight = dir_ / "straight.jsonl";
  auto r = run(train_argv(with({"--train-iters", "8", "--metrics-file", straight.string()}, kMoe)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = losses(straight);
  ASSERT_EQ(want.size(), 8u);
  EXPECT_LT(want.back(), want.front());

  const auto first = dir_ / "first.jsonl", second = dir_ / "second.jsonl";
  const auto ckpt = (dir_ / "ckpt").string();
  r = run(train_argv(with({"--train-iters", "8", "--save", ckpt, "--exit-interval", "4", "--metrics-file", first.string()}, kMoe)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(train_argv(with({"--train-iters", "8", "--load", ckpt, "--save", ckpt, "--metrics-file", second.string()}, kMoe)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto got = losses(first);
  for (const auto& l : losses(second)) got.push_back(l);
  EXPECT_EQ(got, want);
  std::ifstream meta(dir_ / "ckpt" / "iter_0000008" / "metadata.json");
  std::stringstream text;
  text << meta.rdbuf();
  EXPECT_NE(text.str().find("\"num_experts\": 4"), std::string::npos) << text.str().substr(0, 2000);

  // The dense run differs: the flags took effect.
  const auto dense = dir_ / "dense.jsonl";
  ASSERT_EQ(run(train_argv({"--train-iters", "8", "--metrics-file", dense.string()})).exit_code, 0);
  EXPECT_NE(losses(dense), want);
}

// Megatron's MoE metrics: z_loss and load_balancing_loss after "lm loss" in the log line, in the JSONL file and
// under their TensorBoard tags (with each layer's and each expert's load); a zero coefficient is not tracked.
TEST_F(MoeTrainTool, ReportsMegatronsMoeMetrics) {
  const auto metrics = dir_ / "metrics.jsonl";
  const auto tb = dir_ / "tb";
  auto r = run(train_argv(with({"--train-iters", "2", "--metrics-file", metrics.string(), "--tensorboard-dir", tb.string(),
                                "--num-layers", "3", "--moe-layer-freq", "[1,0,1]"}, kMoe)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(" | z_loss: "), std::string::npos) << r.err;
  const auto lm = r.err.find(" | lm loss: "), z = r.err.find(" | z_loss: "), lb = r.err.find(" | load_balancing_loss: ");
  EXPECT_TRUE(lm < z && z < lb && lb < r.err.find(" | loss scale: ", lb)) << r.err;
  EXPECT_NE(r.err.find(" moe load (max / mean tokens per expert) | layer 0: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" | layer 2: "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(" | layer 1: "), std::string::npos) << r.err;  // dense
  const std::string jsonl = read_all(metrics);
  EXPECT_NE(jsonl.find("\"load_balancing_loss\": "), std::string::npos) << jsonl;
  EXPECT_NE(jsonl.find("\"moe_max_load\": "), std::string::npos) << jsonl;
  std::string events;
  for (const auto& f : fs::directory_iterator(tb)) events += read_all(f.path());
  for (const std::string tag : {"load_balancing_loss", "z_loss", "moe/load_balancing_loss_layer_2", "moe/z_loss_layer_0",
                                "moe/tokens_per_expert_layer_2/expert_3"})
    EXPECT_NE(events.find(tag), std::string::npos) << tag;
  EXPECT_EQ(events.find("moe/z_loss_layer_1"), std::string::npos);

  // --moe-aux-loss-coeff 0: Megatron does not track the load-balancing loss.
  const auto no_aux = dir_ / "no_aux.jsonl";
  r = run(train_argv(with(with({"--train-iters", "1", "--metrics-file", no_aux.string()}, kMoe), {"--moe-aux-loss-coeff", "0"})));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("load_balancing_loss"), std::string::npos) << r.err;
  EXPECT_NE(read_all(no_aux).find("\"z_loss\": "), std::string::npos);
}

TEST_F(MoeTrainTool, WhatDlmDoesNotHaveIsRefusedInOneLine) {
  for (const auto& [flag, value, says] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--expert-model-parallel-size", "3", "does not divide --num-experts 4"},
           {"--expert-tensor-parallel-size", "2", "dlm splits each expert over the tensor-parallel group"},
           {"--moe-router-load-balancing-type", "seq_aux_loss", "dlm offers aux_loss"},
           {"--moe-token-drop-policy", "random", "expected probs or position"},
           {"--moe-layer-freq", "([1]*1+[0]*1)*1", "expected an integer N or a list"}}) {
    const auto r = run(train_argv(with({"--train-iters", "2", flag, value}, kMoe)));
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.err;
    const std::string line = last_error_line(r, "dlm-train");
    EXPECT_NE(line.find(flag), std::string::npos) << r.err;
    EXPECT_NE(line.find(says), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace dlm::test
