#include <string>
#include <vector>

#include <boost/program_options/errors.hpp>
#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "train_args.h"

namespace dlm::tools {
namespace {

TrainArgs parse(std::vector<std::string> extra) {
  std::vector<std::string> words = {"dlm-train", "--seq-length", "64", "--train-iters", "10", "--data-path", "d"};
  words.insert(words.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return parse_train_args(static_cast<int>(argv.size()), argv.data());
}

std::string error_of(std::vector<std::string> extra) {
  try {
    parse(std::move(extra));
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
  // Issue 28 cases 15, 18, 20: each a usage error naming its flag.
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

}  // namespace
}  // namespace dlm::tools
