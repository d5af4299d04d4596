// BatchPlan: how a step's global batch splits into micro-batches and over the data-parallel ranks, as
// Megatron counts them. A step of G samples (--global-batch-size) is G / M micro-batches of M rows
// (--micro-batch-size), accumulated; under data parallelism of size DP, rank d runs the global micro-batches
// m = k * DP + d, k = 0 .. G / (M * DP) - 1 (Megatron's sampler: each rank takes its M rows of every M * DP),
// and micro-batch m of iteration i reads the samples i * G + m * M .. i * G + m * M + M - 1. Every user of
// these numbers (the trainer, the dry-run planner, dlm-train's layout checks) asks a BatchPlan.
#pragma once

#include <cstdint>

namespace dlm::train {

class BatchPlan {
 public:
  // dlm::Error of one line naming the flags when M is not positive, G is not a positive multiple of M, or G is
  // not a multiple of M x DP.
  BatchPlan(std::int64_t global_batch_size, std::int64_t micro_batch_size, int data_parallel = 1);
  // Whether the constructor accepts these sizes.
  static bool valid(std::int64_t global_batch_size, std::int64_t micro_batch_size, int data_parallel = 1);

  std::int64_t global_batch_size() const { return global_; }
  std::int64_t micro_batch_size() const { return micro_; }
  int data_parallel() const { return data_parallel_; }
  // G / M: a step's micro-batches over the whole data-parallel group (each weighs 1 / this in the loss).
  std::int64_t micro_batches() const { return global_ / micro_; }
  // G / (M x DP): those one data-parallel rank runs.
  std::int64_t micro_batches_per_rank() const { return micro_batches() / data_parallel_; }
  // The global index of data-parallel rank `rank`'s k-th micro-batch of a step (k < micro_batches_per_rank()).
  std::int64_t micro_batch(int rank, std::int64_t k) const { return k * data_parallel_ + rank; }
  // The first sample of micro-batch m of iteration (or validation round) i.
  std::uint64_t first_sample(std::int64_t iteration, std::int64_t m) const {
    return static_cast<std::uint64_t>(iteration * global_ + m * micro_);
  }

 private:
  std::int64_t global_, micro_;
  int data_parallel_;
};

}  // namespace dlm::train
