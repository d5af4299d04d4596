// MegaDLMs' 1.7B launch arguments (data/megadlms_dlm_pretrain_1.7b.args, expanded from the script as bash does)
// given to dlm-train verbatim: planned for 8 ranks by --dry-run, and, with a tiny shape and local paths appended
// (the last occurrence of a flag wins, as in Megatron's argparse), trained for 20 iterations on the CPU. Then
// the resume Megatron users rely on: --save D --load D on an empty folder, SIGTERM mid-run, the same command again.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "tool_fixture.h"

namespace fs = std::filesystem;

namespace dlm::test {
namespace {

const fs::path kArgsFile = fs::path(DLM_TRAIN_TOOL_DATA) / "megadlms_dlm_pretrain_1.7b.args";

std::vector<std::string> megadlms_args() {
  std::ifstream in(kArgsFile);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') out.push_back(line);
  return out;
}

using MegaDlmsArgs = ToolTest;

TEST_F(MegaDlmsArgs, TheStoredArraysAreTheScripts83Flags) {
  const auto args = megadlms_args();
  ASSERT_EQ(args.size(), 145u);
  std::set<std::string> flags;
  for (const auto& a : args)
    if (a.rfind("--", 0) == 0) flags.insert(a);
  EXPECT_EQ(flags.size(), 83u);
  EXPECT_EQ(args.front(), "--seq-length");
  EXPECT_EQ(args.back(), "no_mask");
}

TEST_F(MegaDlmsArgs, AcceptedVerbatimByADryRunForEightRanks) {
  std::vector<std::string> argv = {kTrainTool, "--dry-run", "--world-size", "8"};
  for (const auto& a : megadlms_args()) argv.push_back(a);
  const auto r = run_keeping_stdout(argv, dir_ / "out");
  const std::string out = read_all(dir_ / "out"), err = r.err;
  ASSERT_EQ(r.exit_code, 0) << err;
  EXPECT_NE(out.find("28 layers, hidden 2048, ffn 6144, 16 heads / 16 KV groups, vocabulary 50304 (padded): 1.733B"),
            std::string::npos) << out;
  EXPECT_NE(out.find("8 ranks = TP 1 x DP 8 x PP 1, distributed optimizer; micro-batch 4, global batch 256, sequence 2048"),
            std::string::npos) << out;
  // Nothing is silently ignored: the flags without effect are named, and so are the checkpoint format and W&B.
  EXPECT_NE(err.find("accepted, no effect in dlm (see --help): --wandb-tags, --wandb-notes, --wandb-resume\n"),
            std::string::npos) << err;
  EXPECT_NE(err.find("--ckpt-format torch_dist: checkpoints are dlm's own format"), std::string::npos) << err;
  EXPECT_NE(err.find("WANDB_DIR=/ckpt/cache/difflm/logs/dlm_training/wandb wandb sync --sync-tensorboard -p dlm --id "
                     "dlm_training /ckpt/cache/difflm/logs/dlm_training/tensorboard"),
            std::string::npos) << err;
}

TEST_F(MegaDlmsArgs, TheLastOccurrenceOfAFlagWins) {
  std::vector<std::string> argv = {kTrainTool, "--dry-run", "--world-size", "8"};
  for (const auto& a : megadlms_args()) argv.push_back(a);
  for (const char* a : {"--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads",
                        "4", "--bf16", "--train-data-path", "a", "b", "--train-data-path", "c"})
    argv.push_back(a);
  const auto r = run_keeping_stdout(argv, dir_ / "out");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(read_all(dir_ / "out").find("2 layers, hidden 64, ffn 128, 4 heads"), std::string::npos)
      << read_all(dir_ / "out");
}

// The script's arrays with a tiny model and local paths appended.
std::vector<std::string> tiny_megadlms_run(const fs::path& dir, const std::string& prefix, const std::string& iters) {
  std::vector<std::string> argv = {kTrainTool};
  for (const auto& a : megadlms_args()) argv.push_back(a);
  const std::string ckpt = (dir / "ckpt").string();
  for (const std::string& a :
       {"--num-layers", "2", "--hidden-size", "32", "--ffn-hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--train-iters", iters.c_str(), "--lr-warmup-iters", "2", "--lr-decay-iters", iters.c_str(),
        "--lr-wsd-decay-iters", "5", "--save-interval", "10", "--eval-interval", "10", "--eval-iters", "2",
        "--log-interval", "1", "--lr", "0.003"})
    argv.push_back(a);
  for (const std::string& a :
       {std::string("--train-data-path"), prefix, std::string("--valid-data-path"), prefix,
        std::string("--data-cache-path"), (dir / "cache").string(), std::string("--tokenizer-type"),
        std::string("NullTokenizer"), std::string("--save"), ckpt, std::string("--load"), ckpt,
        std::string("--tensorboard-dir"), (dir / "tb").string(), std::string("--wandb-save-dir"), (dir / "wandb").string(),
        std::string("--non-persistent-global-ckpt-dir"), (dir / "np").string(), std::string("--device"),
        std::string("cpu"), std::string("--threads"), std::string("1"), std::string("--metrics-file"),
        (dir / "metrics.jsonl").string()})
    argv.push_back(a);
  return argv;
}

TEST_F(MegaDlmsArgs, WithATinyShapeTrainTwentyIterationsOnTheCpu) {
  const auto r = run(tiny_megadlms_run(dir_, prefix_, "20"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto l = losses(dir_ / "metrics.jsonl");
  ASSERT_EQ(l.size(), 20u);
  // Vocabulary 50289: the untrained loss is near ln(50304); 20 steps at lr 3e-3 bring it well down.
  EXPECT_NEAR(std::stod(l.front()), std::log(50304.0), 1.5);
  EXPECT_LT(std::stod(l.back()), std::stod(l.front()) - 1.0);
  EXPECT_NE(r.err.find("no checkpoint there"), std::string::npos) << r.err;  // --load D of an empty D: fresh
  EXPECT_EQ(read_all(dir_ / "ckpt" / "latest"), "iter_0000020\n");
  EXPECT_EQ(read_all(dir_ / "ckpt" / "latest_checkpointed_iteration.txt"), "20");
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "iter_0000010" / "metadata.json"));
  // The script's --log-progress: Megatron's progress.txt in --save, a start and the two checkpoints.
  const std::string progress = read_all(dir_ / "ckpt" / "progress.txt");
  EXPECT_EQ(std::count(progress.begin(), progress.end(), '\n'), 3) << progress;
  EXPECT_NE(progress.find("\t# GPUs: 1\tStarting job\n"), std::string::npos) << progress;
  EXPECT_NE(progress.find("\tSaved checkpoint\tIteration: 20\tJob throughput: "), std::string::npos) << progress;
  // The script's own guard: the tracker at TRAIN_ITERS means "done", so a relaunch trains nothing more.
  const auto again = run(tiny_megadlms_run(dir_, prefix_, "20"));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("resuming"), std::string::npos) << again.err;
  EXPECT_EQ(losses(dir_ / "metrics.jsonl").size(), 20u);
}

// --save D --load D on a folder that does not exist yet, SIGTERM once some iterations are logged, the very same
// command again: the metrics file (appended to) holds the uninterrupted run's loss curve, and Megatron's tracker
// the iteration of each save.
TEST_F(MegaDlmsArgs, SigtermThenTheSameCommandContinuesTheLossCurve) {
  const auto straight = dir_ / "straight.jsonl";
  ASSERT_EQ(run(train_argv({"--train-iters", "400", "--metrics-file", straight.string()})).exit_code, 0);
  const auto want = losses(straight);
  ASSERT_EQ(want.size(), 400u);

  const auto ckpt = (dir_ / "ckpt").string(), metrics = (dir_ / "metrics.jsonl").string();
  const auto command = train_argv({"--train-iters", "400", "--save", ckpt, "--load", ckpt, "--exit-signal-handler",
                                   "--save-interval", "1000", "--metrics-file", metrics});
  const auto err = (dir_ / "err").string();
  const pid_t pid = spawn(command, err);
  const auto t0 = std::chrono::steady_clock::now();
  while (losses(metrics).size() < 20 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(pid, SIGTERM);
  const auto first = wait_child(pid, err);
  ASSERT_EQ(first.exit_code, 0) << first.err;  // a clean exit: the step finished, the checkpoint saved
  const std::size_t stopped = losses(metrics).size();
  ASSERT_GE(stopped, 20u);
  ASSERT_LT(stopped, 400u) << "the run ended before the signal; nothing was tested";
  EXPECT_EQ(read_all(dir_ / "ckpt" / "latest_checkpointed_iteration.txt"), std::to_string(stopped));
  EXPECT_NE(first.err.find(fmt::format("stopping at iteration {} (checkpoint saved)", stopped)), std::string::npos)
      << first.err;

  const auto second = run(command);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find(fmt::format("at iteration {}", stopped)), std::string::npos) << second.err;
  EXPECT_EQ(losses(metrics), want);
  EXPECT_EQ(read_all(dir_ / "ckpt" / "latest_checkpointed_iteration.txt"), "400");
}

// --no-load-optim: the iteration and weights continue, the moments start afresh (the first resumed loss is the
// straight run's, the next ones differ). --finetune: the weights only, from iteration 0.
TEST_F(MegaDlmsArgs, NoLoadOptimAndFinetuneLoadWhatMegatronLoads) {
  const auto straight = dir_ / "straight.jsonl";
  ASSERT_EQ(run(train_argv({"--train-iters", "8", "--metrics-file", straight.string()})).exit_code, 0);
  const auto want = losses(straight);
  const auto ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(run(train_argv({"--train-iters", "8", "--save", ckpt, "--exit-interval", "4"})).exit_code, 0);
  EXPECT_EQ(read_all(dir_ / "ckpt" / "latest_checkpointed_iteration.txt"), "4");

  const auto fresh = dir_ / "fresh.jsonl";
  auto r = run(train_argv({"--train-iters", "8", "--load", ckpt, "--no-load-optim", "--metrics-file", fresh.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("at iteration 4 (--no-load-optim: fresh AdamW moments)"), std::string::npos) << r.err;
  const auto got = losses(fresh);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], want[4]);
  EXPECT_NE(got[1], want[5]);

  const auto tuned = dir_ / "tuned.jsonl";
  const auto out = (dir_ / "tuned").string();
  r = run(train_argv({"--train-iters", "3", "--load", ckpt, "--finetune", "--save", out, "--metrics-file", tuned.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--finetune: weights of"), std::string::npos) << r.err;
  const auto t = losses(tuned);
  ASSERT_EQ(t.size(), 3u);                     // iterations 1..3 again
  EXPECT_LT(std::stod(t[0]), std::stod(want[0]));  // on iteration 0's batch, with trained weights
  EXPECT_EQ(read_all(dir_ / "tuned" / "latest_checkpointed_iteration.txt"), "3");
}

// MegaDLMs' --checkpoint-steps: checkpoints after the listed iterations, besides the interval and the last one.
TEST_F(MegaDlmsArgs, CheckpointStepsSaveAfterTheListedIterations) {
  const auto ckpt = dir_ / "ckpt";
  const auto r = run(train_argv({"--train-iters", "8", "--save", ckpt.string(), "--checkpoint-steps", "2,5,"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> saved;
  for (const auto& e : fs::directory_iterator(ckpt))
    if (e.path().filename().string().rfind("iter_", 0) == 0) saved.push_back(e.path().filename().string());
  std::sort(saved.begin(), saved.end());
  EXPECT_EQ(saved, (std::vector<std::string>{"iter_0000002", "iter_0000005", "iter_0000008"}));
}

// --use-checkpoint-args: a relaunch whose shape flags disagree with the checkpoint takes the checkpoint's shape and
// continues the run (without the flag the same command is refused naming the difference).
TEST_F(MegaDlmsArgs, UseCheckpointArgsTakesTheCheckpointsShape) {
  const auto straight = dir_ / "straight.jsonl";
  ASSERT_EQ(run(train_argv({"--train-iters", "8", "--metrics-file", straight.string()})).exit_code, 0);
  const auto ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(run(train_argv({"--train-iters", "8", "--save", ckpt, "--exit-interval", "4"})).exit_code, 0);
  const auto other_shape = train_argv({"--train-iters", "8", "--load", ckpt, "--ffn-hidden-size", "96",
                                       "--num-layers", "3", "--metrics-file", (dir_ / "resumed.jsonl").string()});
  EXPECT_NE(last_error_line(run(other_shape), "dlm-train").find("the checkpoint has"), std::string::npos);
  auto with_flag = other_shape;
  with_flag.push_back("--use-checkpoint-args");
  const auto r = run(with_flag);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--use-checkpoint-args: the model's shape from"), std::string::npos) << r.err;
  const auto want = losses(straight);
  EXPECT_EQ(losses(dir_ / "resumed.jsonl"), std::vector<std::string>(want.begin() + 4, want.end()));
}

// --exit-duration-in-mins: the run stops after the step that passes the limit, saves, and exits 0.
TEST_F(MegaDlmsArgs, ExitDurationSavesAndExitsCleanly) {
  const auto ckpt = (dir_ / "ckpt").string();
  const auto r = run(train_argv({"--train-iters", "1000000", "--save", ckpt, "--exit-duration-in-mins", "0.01"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string tracker = read_all(dir_ / "ckpt" / "latest_checkpointed_iteration.txt");
  ASSERT_FALSE(tracker.empty());
  EXPECT_LT(std::stoll(tracker), 1000000);
  EXPECT_NE(r.err.find("stopping at iteration " + tracker + " (checkpoint saved)"), std::string::npos) << r.err;
}

// --train-samples with the schedule in samples is the iteration-based run it names: the same losses and learning
// rates, iteration by iteration; so is --lr-warmup-fraction. Counts inside an iteration give Megatron's rates.
TEST_F(MegaDlmsArgs, SampleBasedScheduleIsTheIterationRunItNames) {
  const auto iters = dir_ / "iters.jsonl", samples = dir_ / "samples.jsonl", fraction = dir_ / "fraction.jsonl";
  auto r = run(train_argv({"--train-iters", "8", "--lr-warmup-iters", "2", "--lr-decay-iters", "6", "--min-lr", "1e-4",
                           "--lr-decay-style", "cosine", "--metrics-file", iters.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(train_argv({"--train-samples", "32", "--lr-warmup-samples", "8", "--lr-decay-samples", "24", "--min-lr",
                      "1e-4", "--lr-decay-style", "cosine", "--metrics-file", samples.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 0.3 of 24 samples, in floating point as Megatron computes it (7.199999999999999), falls inside iteration 2.
  const auto inside = dir_ / "inside.jsonl", odd = dir_ / "odd.jsonl";
  r = run(train_argv({"--train-iters", "8", "--lr-warmup-fraction", "0.3", "--lr-decay-iters", "6", "--min-lr", "1e-4",
                      "--lr-decay-style", "cosine", "--metrics-file", inside.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Counts that are not whole iterations of 4: 34 samples train 8 iterations, warmup 6 and decay 27 samples.
  r = run(train_argv({"--train-samples", "34", "--lr-warmup-samples", "6", "--lr-decay-samples", "27", "--min-lr",
                      "1e-4", "--lr-decay-style", "cosine", "--metrics-file", odd.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // megatron-core 0.16.1's OptimizerParamScheduler, get_lr() then step(4) per iteration, printed by repr().
  EXPECT_EQ(metric(inside, "lr"), (std::vector<std::string>{"0", "0.0016666666666666668", "0.002983804698026436",
                                                           "0.0024540602126951632", "0.001441641364299685",
                                                           "0.00048707478584675214", "0.0001", "0.0001"}));
  EXPECT_EQ(metric(odd, "lr"), (std::vector<std::string>{"0", "0.002", "0.0029355805683899043", "0.0024540602126951637",
                                                        "0.0016583586357003155", "0.0008250000000000004",
                                                        "0.00024359514154149244", "0.0001"}));
  r = run(train_argv({"--train-iters", "8", "--lr-warmup-fraction", "0.5", "--lr-decay-iters", "4", "--min-lr", "1e-4",
                      "--lr-decay-style", "cosine", "--metrics-file", fraction.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lr = metric(iters, "lr");
  ASSERT_EQ(lr.size(), 8u);
  EXPECT_EQ(lr[0], "0");                       // the first update uses lr(0) = --lr-warmup-init
  EXPECT_EQ(lr[7], "0.0001");                  // past the decay: --min-lr
  EXPECT_EQ(metric(samples, "lr"), lr);
  EXPECT_EQ(losses(samples), losses(iters));
  EXPECT_EQ(metric(fraction, "lr")[2], "0.003");  // warmup 2 of decay 4: the peak at iteration 2
}

// RANK/WORLD_SIZE > 1 without torchrun's agent (no TORCHELASTIC_RUN_ID, no MPI or Slurm rank): each process would
// train alone into the same folder, so it is refused with one line naming the launchers, before any data is read.
// Under torchrun itself: tests/rendezvous/torchrun_tool_test.cpp.
TEST_F(MegaDlmsArgs, EnvLaunchWithoutTorchrunIsRefusedNamingTheLaunchers) {
  const auto r = run({"/usr/bin/env", "-u", "OMPI_COMM_WORLD_SIZE", "-u", "SLURM_NTASKS", "-u", "PMI_SIZE", "-u",
                      "TORCHELASTIC_RUN_ID", "RANK=0",
                      "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", kTrainTool, "--train-iters", "2", "--seq-length", "16", "--vocab-size", "200", "--mask-token",
                      "199", "--data-path", (dir_ / "missing").string(), "--device", "cpu"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(last_error_line(r, "dlm-train"),
            "dlm-train: WORLD_SIZE=2 without torchrun (no TORCHELASTIC_RUN_ID): dlm-train takes its ranks from torchrun, "
            "mpirun or srun; launch `torchrun --nproc_per_node 2 dlm-train ...` or `mpirun -np 2 dlm-train ...`") << r.err;
}

// A folder holding Megatron's tracker but no dlm checkpoint: one line naming it, not a fresh start over it.
TEST_F(MegaDlmsArgs, AMegatronCheckpointFolderIsNamedNotOverwritten) {
  fs::create_directories(dir_ / "mega");
  std::ofstream(dir_ / "mega" / "latest_checkpointed_iteration.txt") << "1000";
  const auto r = run(train_argv({"--train-iters", "2", "--load", (dir_ / "mega").string()}));
  EXPECT_EQ(r.exit_code, 1);
  const std::string line = last_error_line(r, "dlm-train");
  EXPECT_NE(line.find("a Megatron checkpoint (latest_checkpointed_iteration.txt without dlm's latest)"),
            std::string::npos) << r.err;
}

}  // namespace
}  // namespace dlm::test
