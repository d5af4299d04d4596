// Every flag of every tool, read from the tool's own --help (so a new flag is covered without touching
// this file), given 0, -1, NaN, a huge value, a value beyond every integer type and the empty string.
// Each run must end without a signal; a value the parser refuses is exit 2 naming the flag;
// 0, -1, NaN or "" accepted must be a documented meaning listed below (or the flag a name: a path, a
// kind), a huge number one within the flag's limit; an accepted value then fails on the missing input,
// exit 1. Nothing is left in the working folder.
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "child.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

struct Tool {
  std::string name, path;
  std::vector<std::string> subcommand;        // words after the binary, for --help and the base command
  std::vector<std::string> base;              // a complete command whose input is missing (exit 1)
  std::set<std::string> names;                // flags whose value is a name (path, kind, JSON): any non-empty value parses
  std::set<std::string> accepted;             // "flag=value" pairs with a documented meaning
};

const std::vector<std::string> kValues = {"0", "-1", "nan", "4000000000", "99999999999999999999999", ""};

// The tokenizer flags every tool that opens a tokenizer declares once (tools/flags/tokenizer_flags.h): names,
// and the values they document.
const std::set<std::string> kTokenizerNames = {"tokenizer-type",   "tokenizer-model",        "vocab-file",
                                               "merge-file",       "tiktoken-pattern",       "tiktoken-special-tokens",
                                               "tokenizer-special-tokens"};
const std::set<std::string> kTokenizerAccepted = {"tiktoken-num-special-tokens=0"};

std::vector<Tool> tools() {
  std::vector<Tool> list = {
      {"dlm-preprocess merge", DLM_PREPROCESS_TOOL, {"merge"}, {"--input", "missing", "--output-prefix", "out/x"},
       {"input", "output-prefix"}, {}},
      {"dlm-preprocess inspect", DLM_PREPROCESS_TOOL, {"inspect"}, {"missing"},
       {"tokenizer-type", "tokenizer-model", "vocab-file", "merge-file", "tiktoken-pattern", "tiktoken-special-tokens"},
       {"documents=0", "top=0", "tiktoken-num-special-tokens=0"}},
      {"dlm-preprocess", DLM_PREPROCESS_TOOL, {},
       {"--input", "missing.jsonl", "--output-prefix", "out/x", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"},
       {"input", "output-prefix", "json-keys", "lang", "tokenizer-type", "tokenizer-model", "vocab-file", "merge-file",
        "tiktoken-pattern", "tiktoken-special-tokens", "tokenizer-special-tokens"},
       {"tiktoken-num-special-tokens=0"}},
      {"dlm-blend", DLM_BLEND_TOOL, {},
       {"build", "--data-path", "missing", "--split", "100,0,0", "--seq-length", "16", "--train-samples", "10",
        "--global-batch-size", "2", "--data-cache-path", "cache"},
       {"data-path", "split", "train-data-path", "valid-data-path", "test-data-path", "data-cache-path",
        "tokenizer-identifiers", "sample-split", "tokenizer-type", "tokenizer-model", "vocab-file", "merge-file"},
       {"seed=0", "seed=4000000000", "eval-iters=0", "eod=0"}},
      {"dlm-ckpt", DLM_CKPT_TOOL, {}, {"convert", "--from", "hf", "--to", "native", "missing", "out"},
       {"from", "to", "layers-per-stage", "dtype", "tokenizer", "against"},
       {"rtol=0", "atol=0"}},
      {"dlm-train", DLM_TRAIN_TOOL, {},
       {"--seq-length", "16", "--train-iters", "2", "--data-path", "missing", "--vocab-size", "100", "--mask-token", "99",
        "--threads", "1"},
       {"model-config", "attention-mask-type", "model-running-mode", "difflm-mask-schedule", "lr-decay-style",
        "lr-wsd-decay-style", "on-nan", "device", "recompute-granularity", "data-path", "split", "data-cache-path",
        "tokenizer-type", "tokenizer-model", "save", "load", "tensorboard-dir", "metrics-file",
        "non-persistent-global-ckpt-dir", "wandb-entity", "wandb-run-id", "wandb-project", "wandb-exp-name",
        "wandb-save-dir", "data-args-path",
        "per-split-data-args-path"},
       // 0 means: none, default, or a value Megatron allows (documented in --help).
       {"num-query-groups=0", "kv-channels=0", "vocab-size=0", "init-method-std=0", "mask-token=0",
        "difflm-varilen-prob=0", "lr=0", "min-lr=0", "lr-warmup-iters=0", "lr-warmup-init=0", "lr-decay-iters=0",
        "lr-wsd-decay-iters=0", "weight-decay=0", "adam-beta1=0", "adam-beta2=0", "clip-grad=0", "seed=0",
        "seed=4000000000", "threads=0", "num-layers-per-virtual-pipeline-stage=0", "world-size=0", "save-interval=0",
        "exit-interval=0", "eval-interval=0", "eval-iters=0", "train-iters=4000000000", "lr-warmup-iters=4000000000",
        "lr-decay-iters=4000000000", "lr-wsd-decay-iters=4000000000", "save-interval=4000000000",
        "exit-interval=4000000000", "eval-interval=4000000000", "eval-iters=4000000000", "log-interval=4000000000",
        "ddp-bucket-size=4000000000", "global-batch-size=0", "lr-warmup-fraction=0", "exit-duration-in-mins=0",
        "non-persistent-save-interval=0", "num-experts=0", "moe-aux-loss-coeff=0", "moe-z-loss-coeff=0",
        "moe-shared-expert-intermediate-size=0", "fp8-margin=0", "num-layers-at-start-in-bf16=0",
        "num-layers-at-end-in-bf16=0"}},
      {"dlm-generate", DLM_GENERATE_TOOL, {},
       {"--load", "missing", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--tokenizer-model", "none",
        "--prompt", "1 2"},
       {"load", "tokenizer-type", "tokenizer-model", "prompt", "mode", "remasking", "device", "kv-cache"},
       {"cfg-scale=0", "threshold=0", "temperature=0", "top-k=0", "mask-token=0", "seed=0", "seed=4000000000",
        "threads=0", "cache-refresh=0"}},
  };
  for (Tool& tool : list) {
    tool.names.insert(kTokenizerNames.begin(), kTokenizerNames.end());
    tool.accepted.insert(kTokenizerAccepted.begin(), kTokenizerAccepted.end());
  }
  return list;
}

// The flags --help lists that take a value ("--name arg"), but --help itself and positional holders.
std::vector<std::string> valued_flags(const Tool& tool, const fs::path& dir) {
  std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" --help 1>&2", tool.path};
  argv.insert(argv.end(), tool.subcommand.begin(), tool.subcommand.end());
  const auto r = dlm::test::run(argv, (dir / "help").string());
  EXPECT_EQ(r.exit_code, 0) << tool.name << " --help: " << r.err;
  std::vector<std::string> flags;
  const std::regex line(R"(^\s+(?:-\w \[ )?--([a-z0-9-]+)(?: \])? arg\b)");
  std::istringstream in(r.err);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line) && m[1] != "args") flags.push_back(m[1]);
  }
  return flags;
}

// base with --flag's own occurrence (and its values) removed, then --flag value appended.
std::vector<std::string> command(const Tool& tool, const std::string& flag, const std::string& value) {
  std::vector<std::string> argv{tool.path};
  argv.insert(argv.end(), tool.subcommand.begin(), tool.subcommand.end());
  for (std::size_t i = 0; i < tool.base.size(); ++i) {
    if (tool.base[i] == "--" + flag) {
      while (i + 1 < tool.base.size() && !tool.base[i + 1].starts_with("--")) ++i;
      continue;
    }
    argv.push_back(tool.base[i]);
  }
  argv.push_back("--" + flag);
  argv.push_back(value);
  return argv;
}

TEST(FlagProperty, EveryFlagWithZeroNegativeNanHugeAndEmptyIsAUsageErrorOrADocumentedMeaning) {
  const fs::path dir = dlm::ckpt::test::fresh_dir("flags");
  const fs::path work = dir / "work";
  int runs = 0;
  for (const Tool& tool : tools()) {
    const auto flags = valued_flags(tool, dir);
    EXPECT_GE(flags.size(), 2u) << tool.name;
    for (const std::string& flag : flags) {
      for (const std::string& value : kValues) {
        fs::remove_all(work);
        fs::create_directories(work);
        const auto argv = command(tool, flag, value);
        // The tool runs in `work`, so that anything it leaves is seen.
        std::vector<std::string> in_work{"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", work.string()};
        in_work.insert(in_work.end(), argv.begin(), argv.end());
        const auto r = dlm::test::run(in_work, (dir / "err").string());
        ++runs;
        const std::string what = tool.name + " --" + flag + " '" + value + "'";
        EXPECT_EQ(r.signal, 0) << what << " crashed: " << r.err;
        const bool name = tool.names.count(flag) != 0 && !value.empty();
        // A huge number is a value like another: refused above the flag's limit, else accepted.
        const bool huge = value == "4000000000" || value == "99999999999999999999999";
        const bool documented = huge || tool.accepted.count(flag + "=" + value) != 0;
        if (r.exit_code == 2 && !name) {
          EXPECT_NE(r.err.find("--" + flag), std::string::npos) << what << ": the usage error does not name the flag: " << r.err;
        } else if (!name) {
          EXPECT_TRUE(documented) << what << ": accepted (exit " << r.exit_code << "): " << r.err;
          EXPECT_EQ(r.exit_code, 1) << what << ": " << r.err;
        } else {
          EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << what << ": " << r.err;
        }
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n') <= 2, true) << what << ": " << r.err;
        for (const auto& left : dlm::test::names_in(work)) ADD_FAILURE() << what << " left " << left;
      }
    }
  }
  std::printf("flag property: %d runs\n", runs);
}

}  // namespace
