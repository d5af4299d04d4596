// dlm-train's Megatron data flags as a user meets them: --data-args-path and --per-split-data-args-path stand for
// the words they hold (the same run as the words on the command line), their one-line errors, the evaluation at
// the end of training (the validation split once more, the test split once) with Megatron's lines,
// --full-validation, --mock-data, and a checkpoint's recorded epsilon under Megatron's default.
#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "dlm/data/blend.h"
#include "dlm/data/blend_args.h"
#include "tool_fixture.h"

namespace dlm::test {
namespace {

using DataFlags = ToolTest;

// The fixture's command without one flag and its value.
std::vector<std::string> without(std::vector<std::string> argv, const std::string& flag) {
  const auto at = std::find(argv.begin(), argv.end(), flag);
  if (at != argv.end()) argv.erase(at, at + 2);
  return argv;
}

void write(const std::filesystem::path& path, const std::string& text) { std::ofstream(path) << text; }

TEST_F(DataFlags, DataArgsFilesAreTheRunOfTheirWords) {
  const auto words = dir_ / "words.jsonl", file = dir_ / "file.jsonl", args = dir_ / "data.args";
  write(args, "  1.0\n" + prefix_ + "\n");
  auto argv = without(train_argv({"--train-iters", "4", "--metrics-file", words.string()}), "--data-path");
  argv.insert(argv.end(), {"--data-path", "1.0", prefix_});
  auto r = run(argv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(without(train_argv({"--train-iters", "4", "--data-args-path", args.string(), "--metrics-file", file.string()}),
                  "--data-path"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(losses(words).size(), 4u);
  EXPECT_EQ(losses(file), losses(words));

  // Per split: the train and valid words from JSON (a string, a list), as --train-data-path/--valid-data-path.
  const auto split_words = dir_ / "split_words.jsonl", split_file = dir_ / "split_file.jsonl", json = dir_ / "splits.json";
  write(json, R"({"train": ")" + prefix_ + R"(", "valid": [1, ")" + prefix_ + R"("], "test": null})");
  const std::vector<std::string> eval = {"--train-iters", "4", "--eval-interval", "2", "--eval-iters", "1"};
  auto flags = eval;
  flags.insert(flags.end(), {"--train-data-path", prefix_, "--valid-data-path", "1", prefix_});
  flags.insert(flags.end(), {"--metrics-file", split_words.string()});
  r = run(without(train_argv(flags), "--data-path"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  flags = eval;
  flags.insert(flags.end(), {"--per-split-data-args-path", json.string(), "--metrics-file", split_file.string()});
  r = run(without(train_argv(flags), "--data-path"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(metric(split_words, "valid_loss").size(), 3u);  // at 2, at 4 and at the end
  EXPECT_EQ(losses(split_file), losses(split_words));
  EXPECT_EQ(metric(split_file, "valid_loss"), metric(split_words, "valid_loss"));
}

TEST_F(DataFlags, BadDataArgsFilesAreOneLineNamingTheFile) {
  const auto missing = (dir_ / "missing.args").string(), empty = (dir_ / "empty.args").string(),
             bad = (dir_ / "bad.json").string(), nokey = (dir_ / "nokey.json").string(),
             number = (dir_ / "number.json").string();
  write(empty, " \n");
  write(bad, R"({"train": [)");
  write(nokey, R"({"train": "a", "valid": "b"})");
  write(number, R"({"train": 5, "valid": null, "test": null})");
  const struct {
    std::string flag, file, expect;
  } cases[] = {
      {"--data-args-path", missing, missing + ": cannot open (--data-args-path names it; expected the --data-path words"},
      {"--data-args-path", empty, empty + ": empty; expected the --data-path words: [weight] prefix ... (--data-args-path)"},
      {"--per-split-data-args-path", bad, bad + ": offset 12: not JSON; expected a JSON object"},
      {"--per-split-data-args-path", nokey, nokey + ": no \"test\" key; expected a JSON object"},
      {"--per-split-data-args-path", number, number + ": \"train\" is number; expected a string, a list of words or null"},
  };
  for (const auto& c : cases) {
    const auto r = run(without(train_argv({"--train-iters", "2", c.flag, c.file}), "--data-path"));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(last_error_line(r, "dlm-train").find(c.expect), std::string::npos) << r.err;
  }
  const auto r = run(train_argv({"--train-iters", "2", "--data-args-path", missing}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(last_error_line(r, "dlm-train"), "dlm-train: --data-args-path stands for --data-path: give it alone");
}

// Megatron's pretrain() ends with the validation split (its iterator continuing) and the test split, each printed as
// evaluate_and_print_results prints it; dlm writes them to the metrics file as valid_loss and test_loss.
TEST_F(DataFlags, TrainingEndsWithTheValidationAndTestSplits) {
  const auto metrics = dir_ / "m.jsonl";
  const auto r = run(train_argv({"--train-iters", "4", "--split", "80,10,10", "--eval-interval", "2", "--eval-iters",
                                 "2", "--metrics-file", metrics.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(metric(metrics, "valid_loss").size(), 3u);
  EXPECT_EQ(metric(metrics, "test_loss").size(), 1u);
  EXPECT_NE(r.err.find("validation loss at iteration 4 on validation set | lm loss value: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("validation loss at iteration 4 on test set | lm loss value: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" | lm loss PPL: "), std::string::npos) << r.err;
  // An early stop (here --exit-interval) exits as Megatron's does, without the final evaluations.
  const auto early = dir_ / "early.jsonl";
  const auto e = run(train_argv({"--train-iters", "4", "--split", "80,10,10", "--eval-interval", "2", "--eval-iters",
                                 "2", "--exit-interval", "2", "--metrics-file", early.string()}));
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(metric(early, "valid_loss").size(), 1u);
  EXPECT_TRUE(metric(early, "test_loss").empty());
}

// --full-validation (Megatron's): the validation split is built as one epoch of its documents (no sample count), and
// every evaluation reads all of it from its first sample, so the evaluation after iteration 4 and the one at the
// end give the same loss; a weighted validation blend has no epoch to take and is refused naming the flag.
TEST_F(DataFlags, FullValidationEvaluatesTheWholeValidationSplit) {
  const auto metrics = dir_ / "full.jsonl";
  auto r = run(train_argv({"--train-iters", "4", "--split", "80,10,10", "--eval-interval", "2", "--eval-iters", "1",
                           "--full-validation", "--metrics-file", metrics.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  data::MegatronDataArgs d;
  d.data_path = {prefix_};
  d.split = "80,10,10";
  d.seq_length = 16;
  d.train_iters = 4;
  d.global_batch_size = 4;
  d.eval_iters = 1, d.eval_interval = 2;
  d.seed = 7;
  d.full_validation = true;
  const auto splits = data::build_datasets(data::builder_config(d));
  ASSERT_TRUE(splits[1].has_value());
  const auto& index = splits[1]->datasets.at(0)->index();
  EXPECT_EQ(index.num_epochs, 1);
  const auto samples = static_cast<std::size_t>((index.tokens_per_epoch - 1) / 16);  // GPTDataset's one epoch
  EXPECT_EQ(splits[1]->size(), samples);
  EXPECT_GT(samples, 3u * 4u);  // more than --eval-iters 1 would have read over the run's three evaluations
  EXPECT_NE(r.err.find(fmt::format("--full-validation: each evaluation reads the whole validation split, {} samples",
                                   samples)),
            std::string::npos)
      << r.err;
  const auto valid = metric(metrics, "valid_loss");
  ASSERT_EQ(valid.size(), 3u);  // at 2, at 4 and at the end
  EXPECT_NE(valid[0], valid[1]);
  EXPECT_EQ(valid[1], valid[2]);

  auto argv = without(train_argv({"--train-iters", "4", "--eval-interval", "2", "--full-validation"}), "--data-path");
  argv.insert(argv.end(), {"--data-path", "0.5", prefix_, "0.5", prefix_});
  r = run(argv);
  EXPECT_EQ(r.exit_code, 1);  // found with the data, as the other blend errors
  EXPECT_NE(last_error_line(r, "dlm-train").find("--full-validation evaluates one epoch of the validation split"),
            std::string::npos)
      << r.err;
}

// --mock-data trains on megatron-core's MockGPTDataset samples (interop_mock.py checks them token for token); it
// needs a tokenizer (the tokens' vocabulary and eod) and stands alone for the data.
TEST_F(DataFlags, MockDataTrainsOnMegatronsMockSamples) {
  const auto metrics = dir_ / "mock.jsonl";
  auto r = run(without(train_argv({"--train-iters", "3", "--mock-data", "--tokenizer-type", "NullTokenizer",
                                   "--eval-interval", "2", "--eval-iters", "1", "--metrics-file", metrics.string()}),
                       "--data-path"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--mock-data: megatron-core's MockGPTDataset samples ("), std::string::npos) << r.err;
  EXPECT_EQ(losses(metrics).size(), 3u);
  EXPECT_EQ(metric(metrics, "test_loss").size(), 1u);
  r = run(without(train_argv({"--train-iters", "3", "--mock-data"}), "--data-path"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(last_error_line(r, "dlm-train").find("--mock-data needs --tokenizer-type"), std::string::npos) << r.err;
  r = run(train_argv({"--train-iters", "3", "--mock-data", "--tokenizer-type", "NullTokenizer"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(last_error_line(r, "dlm-train").find("--mock-data stands for the data"), std::string::npos) << r.err;
}

// --norm-epsilon defaults to Megatron's 1e-5; a checkpoint trained with dlm's former default (1e-6) resumes with the
// epsilon it records when the flag is not given, and a flag that disagrees with it is refused naming both.
TEST_F(DataFlags, ACheckpointKeepsItsRecordedEpsilon) {
  const auto ckpt = (dir_ / "ckpt").string();
  const auto straight = dir_ / "straight.jsonl", resumed = dir_ / "resumed.jsonl";
  ASSERT_EQ(run(train_argv({"--train-iters", "4", "--norm-epsilon", "1e-6", "--metrics-file", straight.string()})).exit_code, 0);
  ASSERT_EQ(run(train_argv({"--train-iters", "4", "--norm-epsilon", "1e-6", "--save", ckpt, "--exit-interval", "2"})).exit_code, 0);
  auto r = run(train_argv({"--train-iters", "4", "--load", ckpt, "--metrics-file", resumed.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the checkpoint's RMSNorm epsilon 1e-06 (no --norm-epsilon given)"), std::string::npos) << r.err;
  const auto want = losses(straight), got = losses(resumed);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.end() - 2));  // the same run as with the flag throughout
  r = run(train_argv({"--train-iters", "4", "--load", ckpt, "--norm-epsilon", "1e-5"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(last_error_line(r, "dlm-train").find("--norm-epsilon"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dlm::test
