// The FP8 recipe's host logic (dlm/train/fp8.h): the scale rule, the delayed recipe's amax history under both
// algorithms, the layer choice of --first-last-layers-bf16 and Megatron's checks of the flags.
#include "dlm/train/fp8.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dlm/common/error.h"
#include "dlm/train/cuda_memory_plan.h"
#include "dlm/train/parallel_plan.h"
#include "train_args.h"

namespace dlm::train {
namespace {

TEST(Fp8Scale, FollowsMaxOverAmaxWithMargin) {
  EXPECT_FLOAT_EQ(fp8_scale(2.0f, kFp8E4m3Max, 1.0f, 7.0f), 224.0f);
  EXPECT_FLOAT_EQ(fp8_scale(2.0f, kFp8E4m3Max, std::ldexp(1.0f, -3), 7.0f), 28.0f);  // margin 3
  EXPECT_FLOAT_EQ(fp8_scale(1e-3f, kFp8E5m2Max, 1.0f, 7.0f), 57344.0f / 1e-3f);
  // 0, inf and NaN keep the previous scale; an amax so small that the scale overflows gives FLT_MAX.
  EXPECT_EQ(fp8_scale(0.0f, kFp8E4m3Max, 1.0f, 7.0f), 7.0f);
  EXPECT_EQ(fp8_scale(std::numeric_limits<float>::infinity(), kFp8E4m3Max, 1.0f, 7.0f), 7.0f);
  EXPECT_EQ(fp8_scale(std::numeric_limits<float>::quiet_NaN(), kFp8E4m3Max, 1.0f, 7.0f), 7.0f);
  EXPECT_EQ(fp8_scale(1e-44f, kFp8E5m2Max, 1.0f, 7.0f), FLT_MAX);
}

TEST(Fp8AmaxHistory, MostRecentTakesTheLastIntervalsAmax) {
  AmaxHistory h(3, Fp8Options::AmaxAlgo::kMostRecent);
  h.record(1.0f), h.record(4.0f), h.record(2.0f);  // the interval's max: 4
  EXPECT_FLOAT_EQ(h.update(kFp8E4m3Max, 1.0f, 1.0f), 448.0f / 4.0f);
  EXPECT_EQ(h.window(), (std::vector<float>{4.0f, 0.0f, 0.0f}));
  h.record(8.0f);
  EXPECT_FLOAT_EQ(h.update(kFp8E4m3Max, 1.0f, 1.0f), 448.0f / 8.0f);
  // An interval without a record pushes 0, which keeps the previous scale.
  EXPECT_FLOAT_EQ(h.update(kFp8E4m3Max, 1.0f, 5.0f), 5.0f);
  EXPECT_EQ(h.window(), (std::vector<float>{0.0f, 8.0f, 4.0f}));
}

TEST(Fp8AmaxHistory, MaxTakesTheWindowsLargestUntilItRollsOut) {
  AmaxHistory h(2, Fp8Options::AmaxAlgo::kMax);
  h.record(8.0f);
  EXPECT_FLOAT_EQ(h.update(kFp8E4m3Max, 1.0f, 1.0f), 56.0f);
  h.record(2.0f);
  EXPECT_FLOAT_EQ(h.update(kFp8E4m3Max, 1.0f, 1.0f), 56.0f);  // 8 still in the window
  h.record(1.0f);
  EXPECT_FLOAT_EQ(h.update(kFp8E4m3Max, 1.0f, 1.0f), 224.0f);  // 8 left; max(1, 2)
  EXPECT_EQ(h.window(), (std::vector<float>{1.0f, 2.0f}));
}

TEST(Fp8Options, LayerChoiceKeepsTheFirstAndLastInBf16) {
  Fp8Options o;
  EXPECT_FALSE(o.layer_in_fp8(3, 8));  // off
  o.enabled = true;
  for (int l = 0; l < 8; ++l) EXPECT_TRUE(o.layer_in_fp8(l, 8));
  o.first_last_layers_bf16 = true, o.layers_at_start_in_bf16 = 2, o.layers_at_end_in_bf16 = 1;
  for (int l = 0; l < 8; ++l) EXPECT_EQ(o.layer_in_fp8(l, 8), l >= 2 && l < 7) << l;
}

TEST(Fp8Options, ValidateRefusesWhatMegatronRefuses) {
  Fp8Options o;
  o.enabled = true;
  EXPECT_NO_THROW(o.validate(8, 1));
  o.amax_history_len = 0;
  EXPECT_THROW(o.validate(8, 1), Error);
  o.amax_history_len = 16, o.margin = -1;
  EXPECT_THROW(o.validate(8, 1), Error);
  o.margin = 0, o.first_last_layers_bf16 = true;
  EXPECT_THROW(o.validate(8, 1), Error);  // delayed scaling keeps every layer in FP8
  o.recipe = Fp8Options::Recipe::kTensorwise;
  EXPECT_NO_THROW(o.validate(8, 1));
  o.layers_at_start_in_bf16 = 5;
  EXPECT_THROW(o.validate(8, 2), Error);  // 4 layers a stage
  EXPECT_NO_THROW(o.validate(8, 1));
  o.layers_at_end_in_bf16 = -1;
  EXPECT_THROW(o.validate(8, 1), Error);
}

TEST(Fp8Options, ParsersTakeMegatronsNames) {
  EXPECT_EQ(parse_fp8_format("e4m3"), Fp8Options::Format::kE4m3);
  EXPECT_EQ(parse_fp8_format("hybrid"), Fp8Options::Format::kHybrid);
  EXPECT_THROW(parse_fp8_format("e5m2"), Error);
  EXPECT_EQ(parse_fp8_recipe("tensorwise"), Fp8Options::Recipe::kTensorwise);
  EXPECT_EQ(parse_fp8_recipe("delayed"), Fp8Options::Recipe::kDelayed);
  EXPECT_THROW(parse_fp8_recipe("mxfp8"), Error);
  EXPECT_EQ(parse_fp8_amax_algo("max"), Fp8Options::AmaxAlgo::kMax);
  EXPECT_EQ(parse_fp8_amax_algo("most_recent"), Fp8Options::AmaxAlgo::kMostRecent);
  EXPECT_THROW(parse_fp8_amax_algo("mean"), Error);
  Fp8Options o;
  EXPECT_FLOAT_EQ(o.grad_max(), kFp8E5m2Max);  // hybrid
  o.format = Fp8Options::Format::kE4m3;
  EXPECT_FLOAT_EQ(o.grad_max(), kFp8E4m3Max);
}

tools::TrainArgs parse_fp8(std::vector<std::string> extra) {
  std::vector<std::string> words = {"dlm-train", "--seq-length", "64", "--train-iters", "10", "--data-path", "d",
                                    "--num-layers", "4"};
  words.insert(words.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return tools::parse_train_args(static_cast<int>(argv.size()), argv.data());
}

TEST(Fp8Flags, FillCudaOptions) {
  EXPECT_FALSE(parse_fp8({}).cuda.fp8.enabled);
  const auto a = parse_fp8({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-margin", "2",
                            "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max",
                            "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "2",
                            "--num-layers-at-end-in-bf16", "0", "--device", "cuda"});
  const Fp8Options& f = a.cuda.fp8;
  EXPECT_TRUE(f.enabled);
  EXPECT_EQ(f.format, Fp8Options::Format::kHybrid);
  EXPECT_EQ(f.recipe, Fp8Options::Recipe::kTensorwise);
  EXPECT_EQ(f.margin, 2);
  EXPECT_EQ(f.amax_history_len, 1024);
  EXPECT_EQ(f.amax_algo, Fp8Options::AmaxAlgo::kMax);
  EXPECT_TRUE(f.first_last_layers_bf16);
  EXPECT_EQ(f.layers_at_start_in_bf16, 2);
  EXPECT_EQ(f.layers_at_end_in_bf16, 0);
  const auto d = parse_fp8({"--fp8-format", "e4m3"});  // Megatron's defaults for the rest
  EXPECT_EQ(d.cuda.fp8.format, Fp8Options::Format::kE4m3);
  EXPECT_EQ(d.cuda.fp8.recipe, Fp8Options::Recipe::kDelayed);
  EXPECT_EQ(d.cuda.fp8.amax_history_len, 1);
  EXPECT_EQ(d.cuda.fp8.amax_algo, Fp8Options::AmaxAlgo::kMostRecent);
}

TEST(Fp8Flags, RefusalsNameTheFlag) {
  const auto error_of = [](std::vector<std::string> extra) -> std::string {
    try {
      parse_fp8(std::move(extra));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--device", "cpu"}).find("--fp8-format"), std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "e5m2"}).find("--fp8-format"), std::string::npos);
  EXPECT_NE(error_of({"--fp8-recipe", "blockwise"}).find("--fp8-recipe"), std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--first-last-layers-bf16"}).find("--first-last-layers-bf16"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
                      "--num-layers-at-start-in-bf16", "5"})
                .find("--num-layers-at-start-in-bf16"),
            std::string::npos);
  EXPECT_EQ(error_of({"--fp8-format", "hybrid", "--device", "cuda"}), "");
}

// The dry run's GPU plan counts the FP8 layers' weight copies (2 bytes a linear weight of each FP8 layer) and, once
// per model, the casts' work buffers.
TEST(Fp8Plan, CountsTheWeightCopiesAndTheCastBuffers) {
  ckpt::ModelConfig c;
  c.num_layers = 6, c.hidden_size = 256, c.ffn_hidden_size = 768, c.num_attention_heads = 8, c.num_query_groups = 4;
  c.kv_channels = 32, c.vocab_size = 1000;
  PlanOptions o;
  o.cuda_backend = true, o.bf16 = true, o.seq_length = 128, o.micro_batch_size = 2, o.global_batch_size = 2;
  const auto bf16 = plan_parallel(c, o).stages.at(0);
  o.fp8.enabled = true;
  const auto fp8 = plan_parallel(c, o).stages.at(0);
  const CudaFp8Bytes f = cuda_fp8_bytes(c, 256, 1);
  // qkv 512 x 256, proj 256 x 256, fc1 1536 x 256, fc2 256 x 768: 2 bytes each; work 256 rows x (768 + 2 x 1536).
  EXPECT_EQ(f.per_layer, 2.0 * (512 * 256 + 256 * 256 + 1536 * 256 + 256 * 768));
  EXPECT_EQ(f.work, 256.0 * (768 + 2 * 1536));
  EXPECT_EQ(fp8.weights - bf16.weights, 6 * f.per_layer);
  EXPECT_EQ(fp8.activations - bf16.activations, f.work);
  o.fp8.recipe = Fp8Options::Recipe::kTensorwise, o.fp8.first_last_layers_bf16 = true;
  EXPECT_EQ(plan_parallel(c, o).stages.at(0).weights - bf16.weights, 4 * f.per_layer);
  // Rows that are not a multiple of 16 (difflm-noshift's 2 x 127): the transposed operands hold them padded to 256.
  EXPECT_EQ(cuda_fp8_bytes(c, 254, 1).work, f.work);
}

// dlm-train's start-up line says which layers' GEMMs run in FP8 and what stays bf16 among them.
TEST(Fp8Summary, NamesTheLayersInFp8AndWhatStaysBf16) {
  ckpt::ModelConfig c;
  c.num_layers = 24;
  Fp8Options o;
  EXPECT_EQ(fp8_summary(o, c), "");
  o.enabled = true, o.recipe = Fp8Options::Recipe::kTensorwise;
  const std::string last = "the last layer's fc1/fc2 on a micro-batch whose loss is on some rows only (that MLP then "
                           "runs on those rows)";
  EXPECT_EQ(fp8_summary(o, c), "FP8: hybrid tensorwise: the QKV/proj/fc1/fc2 GEMMs of 24 of 24 layers; in bf16: " + last);
  o.format = Fp8Options::Format::kE4m3, o.first_last_layers_bf16 = true;
  EXPECT_EQ(fp8_summary(o, c), "FP8: e4m3 tensorwise: the QKV/proj/fc1/fc2 GEMMs of 22 of 24 layers");
  o.first_last_layers_bf16 = false, o.recipe = Fp8Options::Recipe::kDelayed;
  c.num_experts = 8, c.moe_layer_freq = 2;  // layers 0, 2, ..., 22 are MoE layers
  EXPECT_EQ(fp8_summary(o, c), "FP8: e4m3 delayed: the QKV/proj/fc1/fc2 GEMMs of 24 of 24 layers; in bf16: the MLP of "
                               "its 12 MoE layers; " + last);
}

}  // namespace
}  // namespace dlm::train
