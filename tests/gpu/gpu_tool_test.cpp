// dlm-train and dlm-generate on the GPU (--device cuda) as a user runs them: the losses of a tiny
// diffusion model follow the CPU run's from the same seed (the GPU draws Model::init's weights and the
// same noise; bf16 activations make the difference), a GPU run saved and resumed continues the straight
// run, and its checkpoint (libckpt's native format) continues on the CPU and samples on the GPU (--fp8 too; with
// the block KV cache refreshed every step: the exact sampler's text). And the GPU's tensor (with sequence),
// pipeline, data and expert layouts through the tool under mpiexec, two ranks sharing this GPU (--device-groups
// staged): their losses follow the one-GPU run, and a TP2+SP checkpoint resumes on one GPU as the whole model.
// The tools' paths can be overridden (DLM_TRAIN_TOOL, DLM_GENERATE_TOOL, DLM_MPIEXEC) where the binaries
// were carried.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "dlm/ckpt/checkpoint.h"
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
    ToolTest::SetUp();
  }
  // The fixture's model with a head dimension the GPU runs (16) and the device chosen. cuDNN's default attention
  // backward accumulates with atomics; the resume test wants one run's numbers: --deterministic-mode.
  std::vector<std::string> argv_on(const std::string& device, std::vector<std::string> extra) const {
    extra.insert(extra.end(),
                 {"--hidden-size", "64", "--ffn-hidden-size", "128", "--device", device, "--deterministic-mode"});
    auto a = train_argv(extra);
    a[0] = tool("DLM_TRAIN_TOOL", kTrainTool);
    return a;
  }
  static std::vector<double> numbers(const std::vector<std::string>& text) {
    std::vector<double> out;
    for (const auto& t : text) out.push_back(std::stod(t));
    return out;
  }

  // 12 iterations on the CPU and on the GPU from the same seed with `model` flags added: every loss within 2e-2.
  void expect_losses_follow_the_cpu_run(const std::vector<std::string>& model, const char* what) {
    const auto cpu = dir_ / "cpu.jsonl", gpu = dir_ / "gpu.jsonl";
    auto with = [&](std::vector<std::string> a) {
      a.insert(a.end(), model.begin(), model.end());
      return a;
    };
    auto r = run(argv_on("cpu", with({"--train-iters", "12", "--metrics-file", cpu.string()})));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = run(argv_on("cuda", with({"--train-iters", "12", "--metrics-file", gpu.string()})));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("on the GPU"), std::string::npos) << r.err;
    const auto want = numbers(losses(cpu)), got = numbers(losses(gpu));
    ASSERT_EQ(want.size(), 12u);
    ASSERT_EQ(got.size(), 12u);
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double rel = std::abs(got[i] - want[i]) / std::abs(want[i]);
      worst = std::max(worst, rel);
      EXPECT_LT(rel, 2e-2) << what << ", iteration " << i + 1 << ": cpu " << want[i] << " gpu " << got[i];
    }
    std::printf("[gpu tool] %s, 12 iterations: worst relative loss difference GPU vs CPU %.3g (first %.6f / %.6f, "
                "last %.6f / %.6f)\n",
                what, worst, want.front(), got.front(), want.back(), got.back());
  }
};

TEST_F(GpuTool, LossesFollowTheCpuRun) { expect_losses_follow_the_cpu_run({}, "dense"); }

// An MoE model through the trainer (the router losses weighted per micro-batch, a shared expert, every other layer
// dense) on the GPU follows the CPU run.
TEST_F(GpuTool, MoeLossesFollowTheCpuRun) {
  expect_losses_follow_the_cpu_run({"--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
                                    "--moe-layer-freq", "2", "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff",
                                    "0.001", "--moe-shared-expert-intermediate-size", "32"},
                                   "MoE");
}

// Megatron's monitoring on the GPU: --log-memory-to-tensorboard writes the device's memory (in use by every context,
// and the model's allocation: at least its fp32 weights, gradients and two moments), --log-params-norm the CPU run's
// norm within bf16 noise, and --log-num-zeros-in-grad the CPU run's count of the gradients' zeros (the structural ones:
// rows and columns no token reaches, the same on both backends; bf16 may rarely round a value to zero on one side).
TEST_F(GpuTool, MonitoringFlagsReportTheDevice) {
  const auto cpu = dir_ / "cpu.jsonl", gpu = dir_ / "gpu.jsonl", tb = dir_ / "tb";
  const std::vector<std::string> flags = {"--train-iters", "4", "--log-params-norm", "--log-num-zeros-in-grad",
                                          "--log-memory-to-tensorboard", "--tensorboard-dir", tb.string(),
                                          "--metrics-file"};
  auto f = flags;
  f.push_back(cpu.string());
  auto r = run(argv_on("cpu", f));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  fs::remove_all(tb);
  f.back() = gpu.string();
  r = run(argv_on("cuda", f));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("--log-num-zeros-in-grad:"), std::string::npos) << r.err;  // no warning: counted
  EXPECT_NE(r.err.find(" num zeros: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" params norm: "), std::string::npos) << r.err;
  const auto want = numbers(metric(cpu, "params_norm")), got = numbers(metric(gpu, "params_norm"));
  ASSERT_EQ(got.size(), 4u);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-2 * want[i]) << "iteration " << i + 1;
  const auto zeros_cpu = numbers(metric(cpu, "num_zeros")), zeros_gpu = numbers(metric(gpu, "num_zeros"));
  ASSERT_EQ(zeros_gpu.size(), 4u);
  ASSERT_EQ(zeros_cpu.size(), 4u);
  for (std::size_t i = 0; i < zeros_gpu.size(); ++i) {
    EXPECT_GT(zeros_gpu[i], 0) << "iteration " << i + 1;
    EXPECT_NEAR(zeros_gpu[i], zeros_cpu[i], 1e-4 * zeros_cpu[i] + 1) << "iteration " << i + 1;
  }
  std::printf("[gpu tool] num zeros, iteration 1: cpu %.0f gpu %.0f\n", zeros_cpu.front(), zeros_gpu.front());
  // The last value of a tag in the event file: the float after "\x0a <length> <tag> \x15" (Value.simple_value).
  std::string events;
  for (const auto& e : fs::directory_iterator(tb)) events = read_all(e.path());
  const auto last = [&](const std::string& tag) {
    const std::string key = std::string("\x0a") + static_cast<char>(tag.size()) + tag + "\x15";
    const auto at = events.rfind(key);
    float v = -1;
    if (at != std::string::npos) std::memcpy(&v, events.data() + at + key.size(), sizeof(v));
    return static_cast<double>(v);
  };
  const double in_use = last("mem-reserved-bytes"), allocated = last("mem-allocated-bytes");
  EXPECT_GT(allocated, 16.0 * 200 * 64) << "the embedding's fp32 weights, gradient and moments at least";
  EXPECT_GE(in_use, allocated);
  EXPECT_EQ(last("mem-max-allocated-bytes"), allocated);
  EXPECT_NEAR(last("num-zeros"), zeros_gpu.back(), 1e-6 * zeros_gpu.back()) << "TensorBoard's num-zeros (a float)";
  std::printf("[gpu tool] memory: device in use %.0f MiB, the model's allocation %.1f MiB\n", in_use / 1048576,
              allocated / 1048576);
}

// --full-validation on the GPU: micro-batches of 3 rows over the whole validation split (its last one short, filled
// with rows of weight 0, and the last call filled up with a micro-batch of weight 0) give the CPU run's validation
// losses within bf16 noise; the evaluation after iteration 4 and the one at the end read the same samples with the
// same weights: the same loss, digit for digit (deterministic kernels).
TEST_F(GpuTool, FullValidationFollowsTheCpuRun) {
  const auto cpu = dir_ / "cpu.jsonl", gpu = dir_ / "gpu.jsonl";
  std::vector<std::string> flags = {"--train-iters", "4", "--micro-batch-size", "3", "--global-batch-size", "9",
                                    "--eval-interval", "2", "--full-validation", "--metrics-file"};
  auto f = flags;
  f.push_back(cpu.string());
  auto r = run(argv_on("cpu", f));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  f.back() = gpu.string();
  r = run(argv_on("cuda", f));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--full-validation: each evaluation reads the whole validation split, "), std::string::npos)
      << r.err;
  const auto want = numbers(metric(cpu, "valid_loss")), got = numbers(metric(gpu, "valid_loss"));
  ASSERT_EQ(want.size(), 3u);  // at 2, at 4 and at the end
  ASSERT_EQ(got.size(), 3u);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-2 * want[i]) << "evaluation " << i + 1;
  EXPECT_EQ(metric(gpu, "valid_loss")[1], metric(gpu, "valid_loss")[2]);
  std::printf("[gpu tool] full validation: cpu %.6f %.6f %.6f, gpu %.6f %.6f %.6f\n", want[0], want[1], want[2], got[0],
              got[1], got[2]);
}

// --recompute-granularity full on the GPU: each layer keeps its input and reruns its forward in the backward,
// with the same kernels (deterministic attention), so the metrics file holds the same losses, digit for digit.
TEST_F(GpuTool, FullRecomputationGivesTheSameLosses) {
  const auto keep = dir_ / "keep.jsonl", again = dir_ / "recompute.jsonl";
  auto r = run(argv_on("cuda", {"--train-iters", "6", "--metrics-file", keep.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(argv_on("cuda", {"--train-iters", "6", "--metrics-file", again.string(), "--recompute-granularity", "full"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("keeps every activation"), std::string::npos) << r.err;  // no CPU-backend warning
  const auto want = losses(keep), got = losses(again);
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(got, want);
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
  const auto sample = [&](const std::string& device, const std::string& flags = "") {
    const auto out = dir_ / ("sample-" + device + std::to_string(flags.size()) + ".txt");
    const std::string cmd = "'" + tool("DLM_GENERATE_TOOL", kGenerateTool) + "' --load '" + ckpt +
                            "' --tokenizer-type NullTokenizer --tokenizer-model none --vocab-size 200 --threads 1"
                            " --prompt '5 12 19' --prompt '7' --max-new-tokens 16 --sample-steps 16"
                            " --inference-block-size 8 --deterministic-mode --device " + device + " " + flags + " > '" +
                            out.string() + "'";
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
  // The block KV cache on the GPU: a refresh every step is the exact sampler's text (two prompt lengths).
  for (const std::string mode : {"prefix", "dual"}) {
    EXPECT_EQ(sample("cuda", "--kv-cache " + mode + " --cache-refresh 1"), on_gpu) << mode;
    const std::string cached = sample("cuda", "--kv-cache " + mode);
    EXPECT_FALSE(cached.empty()) << mode;
    std::printf("[gpu tool] --kv-cache %s on the GPU:\n%s", mode.c_str(), cached.c_str());
  }
  // --fp8 (the layers' GEMMs in FP8, 19 and 17 rows): a line a prompt, each after its prompt; a refresh every step is
  // the FP8 exact sampler's text.
  const std::string fp8 = sample("cuda", "--fp8");
  EXPECT_EQ(std::count(fp8.begin(), fp8.end(), '\n'), 2) << fp8;
  EXPECT_EQ(fp8.rfind("5 12 19", 0), 0u) << fp8;
  EXPECT_EQ(sample("cuda", "--fp8 --kv-cache dual --cache-refresh 1"), fp8);
  std::printf("[gpu tool] --fp8 on the GPU:\n%s", fp8.c_str());
}

// --async-save on the GPU: the save points enqueue the state's copies to pinned memory and training goes on (the next
// AdamW step waits for them on the device); every checkpoint, a save point right after the previous one's included
// (iterations 6 and 7: the second waits for the first's write), is the blocking save's bit for bit, weights and
// moments.
TEST_F(GpuTool, AsyncSaveWritesTheBlockingSavesCheckpointBitForBit) {
  const auto sync = (dir_ / "sync").string(), async = (dir_ / "async").string();
  for (const auto& [root, extra] : {std::pair{sync, std::string()}, std::pair{async, std::string("--async-save")}}) {
    std::vector<std::string> flags = {"--train-iters", "7", "--save", root, "--save-interval", "3"};
    if (!extra.empty()) flags.push_back(extra);
    const auto r = run(argv_on("cuda", flags));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_EQ(read_all(dir_ / "async" / "latest"), "iter_0000007\n");
  // Read here (the GPU machine may not carry dlm-ckpt): every tensor's bytes and the training state.
  const auto same_sets = [](const ckpt::TensorSet& a, const ckpt::TensorSet& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (const auto& [name, t] : a) {
      ASSERT_TRUE(b.count(name)) << what << ": " << name;
      EXPECT_TRUE(t.shape == b.at(name).shape && t.bytes == b.at(name).bytes) << what << ": " << name;
    }
  };
  for (const char* it : {"iter_0000003", "iter_0000006", "iter_0000007"}) {
    const ckpt::CheckpointReader a((dir_ / "async" / it).string()), b((dir_ / "sync" / it).string());
    EXPECT_EQ(a.metadata().state.optimizer_steps, b.metadata().state.optimizer_steps) << it;
    EXPECT_EQ(a.metadata().state.consumed_samples, b.metadata().state.consumed_samples) << it;
    const ckpt::TrainingTensors x = a.read_global(), y = b.read_global();
    ASSERT_TRUE(x.has_optimizer()) << it;
    same_sets(x.params, y.params, std::string(it) + " weights");
    same_sets(x.exp_avg, y.exp_avg, std::string(it) + " exp_avg");
    same_sets(x.exp_avg_sq, y.exp_avg_sq, std::string(it) + " exp_avg_sq");
  }
}

// Checkpoints hold the fp32 masters and AdamW's moments and no FP8 state (scales are taken again from the tensors),
// so precision is a choice of each run: a bf16 run resumes in FP8 (hybrid, tensorwise), and the FP8 run's checkpoint
// resumes in bf16 on the GPU and on the CPU, which has no FP8. Each part follows the straight bf16 run within FP8's
// noise on this model (the tiny FP8 model tests: early losses within 1.5%), and the FP8 part is not bf16's bits.
TEST_F(GpuTool, ABf16RunResumesInFp8AndBack) {
  const auto straight = dir_ / "straight.jsonl", fp8 = dir_ / "fp8.jsonl", back = dir_ / "back.jsonl",
             on_cpu = dir_ / "cpu.jsonl";
  const auto ckpt = (dir_ / "ckpt").string();
  auto r = run(argv_on("cuda", {"--train-iters", "12", "--metrics-file", straight.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(argv_on("cuda", {"--train-iters", "12", "--save", ckpt, "--exit-interval", "4"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(argv_on("cuda", {"--train-iters", "12", "--load", ckpt, "--save", ckpt, "--exit-interval", "8",
                           "--metrics-file", fp8.string(), "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("FP8: hybrid tensorwise: the QKV/proj/fc1/fc2 GEMMs of "), std::string::npos) << r.err;
  ASSERT_TRUE(fs::exists(dir_ / "ckpt" / "iter_0000008" / "metadata.json"));
  r = run(argv_on("cuda", {"--train-iters", "12", "--load", ckpt, "--metrics-file", back.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(argv_on("cpu", {"--train-iters", "12", "--load", ckpt, "--metrics-file", on_cpu.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;

  const auto w = numbers(losses(straight)), f = numbers(losses(fp8)), b = numbers(losses(back)),
             c = numbers(losses(on_cpu));
  ASSERT_EQ(w.size(), 12u);
  ASSERT_EQ(f.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  ASSERT_EQ(c.size(), 4u);
  double fp8_worst = 0, back_worst = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    const double rf = std::abs(f[i] - w[4 + i]) / std::abs(w[4 + i]);
    const double rb = std::abs(b[i] - w[8 + i]) / std::abs(w[8 + i]);
    fp8_worst = std::max(fp8_worst, rf);
    back_worst = std::max(back_worst, rb);
    EXPECT_LT(rf, 1.5e-2) << "FP8 iteration " << 5 + i << ": " << f[i] << " vs bf16 " << w[4 + i];
    EXPECT_LT(rb, 1.5e-2) << "bf16 again, iteration " << 9 + i << ": " << b[i] << " vs " << w[8 + i];
    EXPECT_NEAR(c[i], b[i], 2e-2 * std::abs(b[i])) << "the CPU from the FP8 run's checkpoint, iteration " << 9 + i;
  }
  EXPECT_GT(fp8_worst, 1e-6) << "the resumed FP8 run gave bf16's losses: did it run in FP8?";
  std::printf("[gpu tool] bf16 -> FP8 (iterations 5-8) -> bf16 (9-12): worst relative loss difference to the straight "
              "bf16 run %.3g in FP8, %.3g after\n",
              fp8_worst, back_worst);
}

// Two ranks of dlm-train on this GPU under mpiexec, their device groups staged through MPI (--device-groups staged).
std::vector<std::string> on_two_ranks(std::vector<std::string> argv) {
  std::vector<std::string> a = {tool("DLM_MPIEXEC", DLM_MPIEXEC), "-np", "2", "--oversubscribe", "--allow-run-as-root",
                                "--bind-to", "none", "--mca", "btl", "self,vader", "-x", "LD_LIBRARY_PATH"};
  a.insert(a.end(), argv.begin(), argv.end());
  a.insert(a.end(), {"--device-groups", "staged"});
  return a;
}

TEST_F(GpuTool, TensorAndPipelineLayoutsFollowTheOneGpuRunAndResumeWhole) {
  struct Layout {
    const char* name;
    std::vector<std::string> flags;
    std::vector<std::string> model;  // the model's own flags, for the one-GPU run too
  };
  // Interleaved PP2 with one layer per chunk needs 4 layers: two chunks per rank, stages 0-3 as r, 2 + r.
  const std::vector<Layout> layouts = {
      {"TP2+SP", {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, {}},
      {"PP2", {"--pipeline-model-parallel-size", "2"}, {}},
      {"PP2-interleaved",
       {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"},
       {"--num-layers", "4"}},
      // Full recomputation under TP2 + SP (the rerun forward repeats its gathers and reduce-scatters) and with
      // interleaved PP2 (several micro-batches in flight, each slot with its own layer inputs).
      {"TP2+SP-recompute",
       {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--recompute-granularity", "full"}, {}},
      // Half the micro-batches cut to a random length (MegaDLMs' variable-length draw): a step's micro-batches come
      // in several shapes, each run of one shape through the schedule in turn (interleaved: filled up with
      // zero-weight copies to a multiple of the pipeline's size).
      {"TP2+SP-varilen", {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, {"--difflm-varilen-prob", "0.5"}},
      {"PP2-interleaved-varilen",
       {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"},
       {"--num-layers", "4", "--difflm-varilen-prob", "0.5"}},
      {"PP2-interleaved-recompute",
       {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
        "--recompute-granularity", "full"},
       {"--num-layers", "4"}},
      // DP2 through the model's own data group (staged: no device communicator for the trainer's all-reduce):
      // the distributed optimizer (each rank's range of the master weights; the checkpoint gathers them), and
      // the reduction overlapped with the backward in buckets small enough to cut the 2-layer model.
      {"DP2-distributed-optimizer", {"--use-distributed-optimizer"}, {}},
      {"DP2-overlap", {"--overlap-grad-reduce", "--ddp-bucket-size", "20000"}, {}},
      // Expert parallelism (DP2 = EP2): a 4-expert MoE model, each rank two experts, the routed rows exchanged by
      // all-to-all; the model reduces its gradients itself (the experts' over the one-rank expert-DP group).
      {"EP2-moe",
       {"--expert-model-parallel-size", "2"},
       {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64", "--moe-aux-loss-coeff", "0.01"}},
      // Neither: the trainer's own all-reduce needs NCCL's device communicator, refused in one line (below).
  };
  for (const Layout& layout : layouts) {
    const auto whole = dir_ / (std::string(layout.name) + "-whole.jsonl");
    auto whole_flags = layout.model;
    whole_flags.insert(whole_flags.end(), {"--train-iters", "10", "--metrics-file", whole.string()});
    auto r = run(argv_on("cuda", whole_flags));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto want = numbers(losses(whole));
    ASSERT_EQ(want.size(), 10u);
    const auto metrics = dir_ / (std::string(layout.name) + ".jsonl");
    const auto ckpt = (dir_ / (std::string(layout.name) + "-ckpt")).string();
    auto flags = layout.flags;
    flags.insert(flags.end(), layout.model.begin(), layout.model.end());
    // A hang (a collective one rank skips) fails within a minute, naming the rank, instead of stalling the suite.
    flags.insert(flags.end(), {"--train-iters", "10", "--save", ckpt, "--save-interval", "5", "--metrics-file",
                               metrics.string(), "--distributed-timeout-minutes", "1"});
    r = run(on_two_ranks(argv_on("cuda", flags)));
    ASSERT_EQ(r.exit_code, 0) << layout.name << ": " << r.err;
    const auto got = numbers(losses(metrics));
    ASSERT_EQ(got.size(), want.size()) << layout.name;
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double rel = std::abs(got[i] - want[i]) / std::abs(want[i]);
      worst = std::max(worst, rel);
      // TP's partial sums round to bf16 before they are added (the layout test's 1e-4 in 8 steps); PP's
      // stages compute what one GPU does; DP sums each gradient in another order (fp32).
      EXPECT_LT(rel, 5e-3) << layout.name << ", iteration " << i + 1 << ": one GPU " << want[i] << ", layout "
                           << got[i];
    }
    std::printf("[gpu tool] %s on two ranks sharing the GPU: worst relative loss difference to one GPU %.3g "
                "(last %.6f / %.6f)\n",
                layout.name, worst, want.back(), got.back());
    // Its iteration-5 checkpoint (each rank's shards) continues on one GPU as the whole model.
    const auto resumed = dir_ / (std::string(layout.name) + "-resumed.jsonl");
    auto resume_flags = layout.model;
    resume_flags.insert(resume_flags.end(),
                        {"--train-iters", "10", "--load", ckpt + "/iter_0000005", "--metrics-file", resumed.string()});
    r = run(argv_on("cuda", resume_flags));
    ASSERT_EQ(r.exit_code, 0) << layout.name << " resumed whole: " << r.err;
    const auto after = numbers(losses(resumed));
    ASSERT_EQ(after.size(), 5u) << layout.name;
    for (std::size_t i = 0; i < after.size(); ++i)
      EXPECT_LT(std::abs(after[i] - got[5 + i]) / std::abs(got[5 + i]), 5e-3)
          << layout.name << " resumed whole, iteration " << 6 + i << ": " << after[i] << " vs " << got[5 + i];
  }
}

// Tensor parallelism of MoE layers is the CPU backend's: the CUDA backend refuses it in one line naming itself,
// before any rank starts.
TEST_F(GpuTool, MoeWithTensorParallelismIsRefusedNamingTheCudaBackend) {
  const auto r = run(argv_on("cuda", {"--train-iters", "2", "--num-experts", "4", "--tensor-model-parallel-size", "2"}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(last_error_line(r, "dlm-train"),
            "dlm-train: --tensor-model-parallel-size 2 with --num-experts 4: the CUDA backend runs MoE layers without "
            "tensor parallelism (the CPU backend has it: --device cpu)");
}

TEST_F(GpuTool, StagedDataParallelWithoutTheModelsOwnReductionIsRefused) {
  const auto r = run(on_two_ranks(argv_on("cuda", {"--train-iters", "2"})));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("data parallelism of a model trained on the GPU needs NCCL"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dlm::test
