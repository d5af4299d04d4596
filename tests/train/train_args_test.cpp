#include <string>
#include <vector>

#include <boost/program_options/errors.hpp>
#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "train_args.h"

namespace dlm::tools {
namespace {

const std::vector<std::string> kBase = {"--seq-length", "64", "--train-iters", "10", "--data-path", "d"};
// Without a length: the tests of --train-iters against --train-samples.
const std::vector<std::string> kNoLength = {"--seq-length", "64", "--data-path", "d", "--global-batch-size", "8"};

TrainArgs parse(std::vector<std::string> extra, const std::vector<std::string>& base = kBase) {
  std::vector<std::string> words = {"dlm-train"};
  words.insert(words.end(), base.begin(), base.end());
  words.insert(words.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return parse_train_args(static_cast<int>(argv.size()), argv.data());
}

std::string error_of(std::vector<std::string> extra, const std::vector<std::string>& base = kBase) {
  try {
    parse(std::move(extra), base);
  } catch (const Error& e) {
    return e.what();
  } catch (const boost::program_options::error& e) {  // the ranges of flag_checks.h
    return e.what();
  }
  return "";
}

TEST(TrainArgs, MegatronFlagsFillTheOptions) {
  auto a = parse({"--num-layers", "3", "--hidden-size", "96", "--num-attention-heads", "6", "--group-query-attention",
                  "--num-query-groups", "2", "--ffn-hidden-size", "256", "--micro-batch-size", "2",
                  "--global-batch-size", "8", "--lr", "3e-4", "--min-lr", "3e-5", "--lr-decay-style", "WSD",
                  "--lr-wsd-decay-iters", "4", "--mask-token", "50277", "--untie-embeddings-and-output-weights",
                  "--qk-layernorm", "--seed", "9"});
  EXPECT_EQ(a.model.num_layers, 3);
  EXPECT_EQ(a.model.kv_channels, 16);
  EXPECT_EQ(a.model.num_query_groups, 2);
  EXPECT_FALSE(a.model.tie_word_embeddings);
  EXPECT_TRUE(a.model.qk_layernorm);
  EXPECT_EQ(a.model.attention_mask, ckpt::AttentionMask::kBidirectional);
  EXPECT_EQ(a.trainer.lr.decay_iters, 10);  // defaults to --train-iters
  EXPECT_EQ(a.trainer.lr.global_batch_size, 8);
  EXPECT_EQ(a.trainer.lr.style, train::LrDecayStyle::kWsd);
  EXPECT_EQ(a.trainer.objective.mask_token, 50277);
  EXPECT_EQ(a.trainer.objective.seed, 9u);
  EXPECT_EQ(parse({"--model-running-mode", "vanilla"}).model.attention_mask, ckpt::AttentionMask::kCausal);
  EXPECT_TRUE(parse({}).model.tie_word_embeddings);  // Megatron ties by default
}

// The CUDA backend's choices are flags (CudaOptions), never the environment.
TEST(TrainArgs, CudaFlagsFillCudaOptions) {
  const auto defaults = parse({}).cuda;
  EXPECT_FALSE(defaults.deterministic);
  EXPECT_EQ(defaults.attention, train::CudaOptions::Attention::kCudnn);
  EXPECT_FALSE(defaults.profile);
  EXPECT_TRUE(defaults.cuda_graphs);
  const auto set = parse({"--deterministic-mode", "--cuda-attention", "own", "--cuda-profile"}).cuda;
  EXPECT_TRUE(set.deterministic);
  EXPECT_EQ(set.attention, train::CudaOptions::Attention::kOwn);
  EXPECT_TRUE(set.profile);
  try {
    parse({"--cuda-attention", "flash"});
    FAIL() << "no error";
  } catch (const boost::program_options::error& e) {
    EXPECT_STREQ(e.what(), "--cuda-attention: 'flash' is not cudnn or own");
  }
  EXPECT_THROW(parse({"--no-cuda-graphs"}), boost::program_options::error);  // sampling only (dlm-generate)
}

TEST(TrainArgs, DeviceGroupsAreNcclUnlessStagedForTests) {
  EXPECT_FALSE(parse({}).staged_device_groups);
  EXPECT_FALSE(parse({"--device-groups", "nccl"}).staged_device_groups);
  EXPECT_TRUE(parse({"--device-groups", "staged"}).staged_device_groups);
  EXPECT_EQ(error_of({"--device-groups", "mpi"}), "--device-groups: 'mpi' is not nccl or staged");
}

TEST(TrainArgs, InvalidConfigsFailBeforeAnything) {
  EXPECT_NE(error_of({"--hidden-size", "100", "--num-attention-heads", "3"}).find("--num-attention-heads 3 does not divide --hidden-size 100"), std::string::npos);
  EXPECT_NE(error_of({"--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "3"}).find("--num-query-groups 3"), std::string::npos);
  EXPECT_NE(error_of({"--max-position-embeddings", "32"}).find("--seq-length 64 is longer than --max-position-embeddings 32"), std::string::npos);
  EXPECT_NE(error_of({"--lr-decay-style", "exp"}).find("--lr-decay-style"), std::string::npos);
  EXPECT_NE(error_of({"--model-running-mode", "vanilla", "--attention-mask-type", "no_mask"}).find("causal"), std::string::npos);
  EXPECT_NE(error_of({"--save-interval", "5"}).find("--save"), std::string::npos);
  EXPECT_NE(error_of({"--ddp-bucket-size", "0"}).find("--ddp-bucket-size 0: expected 1 to"), std::string::npos);
  EXPECT_NE(error_of({"--ddp-bucket-size", "-5"}).find("--ddp-bucket-size -5: expected 1 to"), std::string::npos);
  // Each a usage error naming its flag.
  EXPECT_EQ(error_of({"--micro-batch-size", "0"}), "--micro-batch-size 0: expected 1 to 1048576");
  EXPECT_EQ(error_of({"--mask-token", "-5"}), "--mask-token -5: expected 0 to 2147483647");
  EXPECT_EQ(error_of({"--lr", "nan"}), "--lr nan: expected a finite number");
  EXPECT_EQ(error_of({"--make-vocab-size-divisible-by", "1000000000"}),
            "--make-vocab-size-divisible-by 1000000000: expected 1 to 65536");
  std::vector<std::string> words = {"dlm-train", "--train-iters", "10"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  EXPECT_THROW(parse_train_args(3, argv.data()), boost::program_options::error);  // --seq-length missing
}

// Megatron's argparse: a repeated flag's last occurrence wins (a script's shape overridden by appended flags), for
// switches, values and multi-word values alike; negative numbers are values.
TEST(TrainArgs, TheLastOccurrenceOfARepeatedFlagWins) {
  auto a = parse({"--num-layers", "28", "--bf16", "--adam-eps", "2e-8", "--data-path", "1.0", "x", "0.5", "y",
                  "--num-layers", "2", "--bf16", "--data-path", "z", "--lr-warmup-init", "-0.5", "--lr-warmup-init", "0"});
  EXPECT_EQ(a.model.num_layers, 2);
  EXPECT_TRUE(a.bf16);
  EXPECT_EQ(a.trainer.adam.eps, 2e-8);
  EXPECT_EQ(a.data_path, std::vector<std::string>{"z"});
  EXPECT_EQ(a.trainer.lr.init_lr, 0.0);
}

// Megatron's default global batch is micro-batch x data-parallel size (was 1, which no micro-batch above 1 or
// data-parallel run could use).
TEST(TrainArgs, GlobalBatchDefaultsToOneMicroBatchPerDataParallelRank) {
  EXPECT_EQ(parse({"--micro-batch-size", "4"}).trainer.global_batch_size, 4);
  EXPECT_EQ(parse({"--micro-batch-size", "4", "--world-size", "8", "--tensor-model-parallel-size", "2"})
                .trainer.global_batch_size, 16);
  EXPECT_EQ(parse({"--micro-batch-size", "4", "--global-batch-size", "64"}).trainer.global_batch_size, 64);
  EXPECT_EQ(parse({"--micro-batch-size", "4", "--world-size", "8"}).trainer.lr.global_batch_size, 32);
}

TEST(TrainArgs, MegatronResumeFlags) {
  auto a = parse({"--load", "ck", "--no-load-optim", "--exit-duration-in-mins", "1.5", "--exit-signal-handler",
                  "--no-load-rng"});
  EXPECT_TRUE(a.no_load_optim);
  EXPECT_FALSE(a.finetune);
  EXPECT_EQ(a.exit_duration_minutes, 1.5);
  EXPECT_TRUE(parse({"--load", "ck", "--finetune"}).finetune);
  EXPECT_EQ(error_of({"--finetune"}), "--finetune needs --load");
  EXPECT_EQ(error_of({"--no-load-optim"}), "--no-load-optim needs --load");
  EXPECT_EQ(error_of({"--use-checkpoint-args"}), "--use-checkpoint-args needs --load");
  EXPECT_NE(error_of({"--exit-duration-in-mins", "-1"}).find("--exit-duration-in-mins -1 must be positive"), std::string::npos);
  EXPECT_NE(error_of({"--exit-duration-in-mins", "nan"}).find("--exit-duration-in-mins nan"), std::string::npos);
  EXPECT_NE(error_of({"--normalization", "LayerNorm"}).find("--normalization LayerNorm: not supported"), std::string::npos);
  EXPECT_NE(error_of({"--hidden-dropout", "0.1"}).find("--hidden-dropout 0.1: not supported"), std::string::npos);
  EXPECT_NE(error_of({"--add-qkv-bias"}).find("--add-qkv-bias: not supported"), std::string::npos);
  EXPECT_EQ(error_of({"--swiglu", "yes"}), "'yes' after --swiglu: not a value --swiglu takes");
  EXPECT_EQ(error_of({"--lr", "0.1", "0.2"}), "'0.2' after --lr: not a value --lr takes");
  EXPECT_EQ(error_of({"--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                      "--disable-bias-linear", "--attention-dropout", "0.0", "--hidden-dropout", "0"}),
            "");
}

// Megatron's defaults where dlm's differed only by accident.
TEST(TrainArgs, DefaultsAreMegatrons) {
  const auto a = parse({});
  EXPECT_EQ(a.model.norm_epsilon, 1e-5);
  EXPECT_FALSE(a.norm_epsilon_given);
  EXPECT_EQ(a.trainer.eval_iters, 100);
  EXPECT_EQ(a.trainer.eval_interval, 1000);
  EXPECT_EQ(a.trainer.log_interval, 100);
  EXPECT_TRUE(parse({"--norm-epsilon", "1e-5"}).norm_epsilon_given);
  EXPECT_EQ(parse({"--eval-iters", "0"}).trainer.eval_iters, 0);  // Megatron's way to evaluate nothing
}

// Megatron's sample-based training: iterations = samples / global batch (rounded down), the schedule in samples
// (decay defaults to --train-samples), --lr-warmup-fraction of the decay as a float of samples; counts that are not
// whole iterations are Megatron's too; each unit refuses the other's flags.
TEST(TrainArgs, SampleBasedTrainingAndWarmupFraction) {
  auto a = parse({"--train-samples", "803", "--lr-warmup-samples", "12", "--lr-decay-samples", "643",
                  "--lr-decay-style", "WSD", "--lr-wsd-decay-samples", "81"}, kNoLength);
  EXPECT_EQ(a.trainer.train_iters, 100);
  EXPECT_EQ(a.train_samples, 803);
  EXPECT_EQ(a.trainer.lr.warmup_samples, 12.0);
  EXPECT_EQ(a.trainer.lr.decay_samples, 643);
  EXPECT_EQ(a.trainer.lr.wsd_decay_samples, 81);
  a = parse({"--train-samples", "803"}, kNoLength);
  EXPECT_EQ(a.trainer.lr.decay_samples, 803);  // --train-samples, not 100 iterations x 8
  a = parse({"--train-samples", "800", "--lr-warmup-fraction", "0.1"}, kNoLength);
  EXPECT_EQ(a.trainer.lr.decay_samples, 800);
  EXPECT_EQ(a.trainer.lr.warmup_samples, 0.1 * 800.0);
  a = parse({"--train-iters", "50", "--lr-decay-iters", "40", "--lr-warmup-fraction", "0.01"}, kNoLength);
  EXPECT_EQ(a.trainer.lr.decay_iters, 40);
  EXPECT_EQ(a.trainer.lr.warmup_samples, 0.01 * 320.0);  // 3.2 samples: inside the first iteration
  EXPECT_FALSE(a.trainer.lr.decay_samples);
  EXPECT_FALSE(a.train_samples);

  EXPECT_EQ(error_of({}, kNoLength), "give exactly one of --train-iters and --train-samples");
  EXPECT_EQ(error_of({"--train-iters", "5", "--train-samples", "40"}, kNoLength),
            "give exactly one of --train-iters and --train-samples");
  EXPECT_EQ(error_of({"--train-samples", "800", "--lr-warmup-iters", "2"}, kNoLength),
            "--lr-warmup-iters: training is given in samples (--train-samples), so is the schedule");
  EXPECT_EQ(error_of({"--train-iters", "100", "--lr-decay-samples", "800"}, kNoLength),
            "--lr-decay-samples: training is given in iterations (--train-iters), so is the schedule");
  EXPECT_EQ(error_of({"--train-iters", "50", "--lr-warmup-iters", "2", "--lr-warmup-fraction", "0.2"}, kNoLength),
            "--lr-warmup-fraction and --lr-warmup-iters: give one");
  EXPECT_NE(error_of({"--train-samples", "7"}, kNoLength).find("--train-samples 7 is less than one --global-batch-size 8"),
            std::string::npos);
  EXPECT_NE(error_of({"--train-samples", "800", "--lr-decay-samples", "-8"}, kNoLength).find("--lr-decay-samples"),
            std::string::npos);
  EXPECT_NE(error_of({"--train-samples", "-8"}, kNoLength).find("--train-samples -8 must be positive"), std::string::npos);
  EXPECT_NE(error_of({"--train-iters", "5", "--lr-warmup-fraction", "nan"}, kNoLength).find("--lr-warmup-fraction nan"),
            std::string::npos);
}

}  // namespace
}  // namespace dlm::tools
