#include "dlm/train/batch_plan.h"

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train {

BatchPlan::BatchPlan(std::int64_t global_batch_size, std::int64_t micro_batch_size, int data_parallel)
    : global_(global_batch_size), micro_(micro_batch_size), data_parallel_(data_parallel) {
  if (micro_ <= 0) fail(fmt::format("--micro-batch-size: {} must be positive", micro_));
  if (global_ <= 0 || global_ % micro_ != 0)
    fail(fmt::format("--global-batch-size {} must be a positive multiple of --micro-batch-size {}", global_, micro_));
  if (data_parallel_ <= 0) fail(fmt::format("the data-parallel size {} must be positive", data_parallel_));
  if (global_ % (micro_ * data_parallel_) != 0)
    fail(fmt::format("--global-batch-size {} must be a multiple of --micro-batch-size {} x the data-parallel size {}",
                     global_, micro_, data_parallel_));
}

bool BatchPlan::valid(std::int64_t global_batch_size, std::int64_t micro_batch_size, int data_parallel) {
  return micro_batch_size > 0 && data_parallel > 0 && global_batch_size > 0 &&
         global_batch_size % (micro_batch_size * data_parallel) == 0;
}

}  // namespace dlm::train
