// The FP8 recipe's host logic (dlm/train/fp8.h): the scale rule, the delayed recipe's amax history under both
// algorithms, the layer choice of --first-last-layers-bf16 and Megatron's checks of the flags.
#include "dlm/train/fp8.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "dlm/common/error.h"

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

}  // namespace
}  // namespace dlm::train
