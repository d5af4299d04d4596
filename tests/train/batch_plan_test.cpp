#include "dlm/train/batch_plan.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dlm/common/error.h"

namespace dlm::train {
namespace {

std::string error_of(std::int64_t global, std::int64_t micro, int data) {
  try {
    BatchPlan(global, micro, data);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// G = 24, M = 2, DP = 3: 12 micro-batches, 4 a rank; rank 1 runs 1, 4, 7, 10 and iteration 2's micro-batch 7
// starts at sample 2 * 24 + 7 * 2.
TEST(BatchPlan, SplitsTheGlobalBatchAsMegatronsSampler) {
  const BatchPlan plan(24, 2, 3);
  EXPECT_EQ(plan.micro_batches(), 12);
  EXPECT_EQ(plan.micro_batches_per_rank(), 4);
  std::vector<std::int64_t> rank1;
  for (std::int64_t k = 0; k < plan.micro_batches_per_rank(); ++k) rank1.push_back(plan.micro_batch(1, k));
  EXPECT_EQ(rank1, (std::vector<std::int64_t>{1, 4, 7, 10}));
  EXPECT_EQ(plan.first_sample(2, 7), 62u);
  // Every micro-batch of a step belongs to exactly one rank.
  std::vector<int> owner(12, -1);
  for (int d = 0; d < 3; ++d)
    for (std::int64_t k = 0; k < plan.micro_batches_per_rank(); ++k) {
      const std::int64_t m = plan.micro_batch(d, k);
      ASSERT_EQ(owner[static_cast<std::size_t>(m)], -1);
      owner[static_cast<std::size_t>(m)] = d;
    }
  EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
}

TEST(BatchPlan, RejectsSizesThatDoNotDivideWithOneLine) {
  EXPECT_EQ(error_of(8, 0, 1), "--micro-batch-size: 0 must be positive");
  EXPECT_EQ(error_of(7, 2, 1), "--global-batch-size 7 must be a positive multiple of --micro-batch-size 2");
  EXPECT_EQ(error_of(0, 2, 1), "--global-batch-size 0 must be a positive multiple of --micro-batch-size 2");
  EXPECT_EQ(error_of(8, 2, 3),
            "--global-batch-size 8 must be a multiple of --micro-batch-size 2 x the data-parallel size 3");
  EXPECT_EQ(error_of(8, 2, 4), "");
  EXPECT_TRUE(BatchPlan::valid(8, 2, 4));
  EXPECT_FALSE(BatchPlan::valid(8, 2, 3));
  EXPECT_FALSE(BatchPlan::valid(0, 2, 1));
}

}  // namespace
}  // namespace dlm::train
