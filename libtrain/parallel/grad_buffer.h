// Data parallelism's gradient buffer, as megatron-core's DistributedDataParallel lays it out: every
// parameter's gradient end to end in reverse model order (the order the backward pass finishes them,
// so a later overlap can reduce a bucket while the rest of the backward runs), cut at parameter
// boundaries into buckets of at least `bucket_elements`, each bucket padded to a multiple of the
// data-parallel size DP so that rank d owns the contiguous d-th 1/DP of every bucket.
//
// Without the distributed optimizer each bucket is all-reduced (sum) and every rank updates every
// parameter. With it (ZeRO-1, Megatron's --use-distributed-optimizer) each bucket is reduce-scattered,
// rank d updates the parameter pieces of its shards with its own AdamW moments (1/DP of them), and the
// updated weights are all-gathered bucket by bucket.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dlm/train/communicator.h"
#include "dlm/train/optimizer.h"

namespace dlm::train {

class GradBuffer {
 public:
  GradBuffer(std::span<const ParamRef> params, int dp_size, int dp_rank, std::int64_t bucket_elements);

  // Sums every gradient over the group, in place.
  void all_reduce_gradients(std::span<const ParamRef> params, Communicator& dp);
  // Sums the gradients over the group into this rank's shards; shard_params() then views them.
  void reduce_scatter_gradients(std::span<const ParamRef> params, Communicator& dp);
  // --overlap-grad-reduce: the reductions start during the step's last backward. begin_overlap() before
  // it; mark_ready(param) as each gradient becomes final; a bucket whose gradients are all final starts
  // at once, in bucket order (the same order on every rank, as the collectives need); finish_overlap()
  // starts any bucket left and waits: then the gradients (all-reduce) or this rank's shards (`scatter`,
  // the distributed optimizer) hold the sums, as after all_reduce_gradients / reduce_scatter_gradients.
  void begin_overlap(std::span<const ParamRef> params, Communicator& dp, bool scatter);
  void mark_ready(std::size_t param);
  void finish_overlap();
  std::size_t buckets_started_early() const { return started_early_; }

  // The pieces of parameters this rank owns: value = the parameter's own memory, grad = the reduced
  // shard. In a fixed order: the distributed optimizer's moments are kept per piece.
  std::vector<ParamRef> shard_params(std::span<const ParamRef> params);
  // Every rank's updated pieces into every rank's parameters.
  void all_gather_weights(std::span<const ParamRef> params, Communicator& dp);

  // Per-parameter moments (model order) from the per-piece ones of every rank (collective), and back.
  AdamW gather_optimizer(const AdamW& shard, std::span<const ParamRef> params, Communicator& dp) const;
  AdamW shard_optimizer(const AdamW& full, std::span<const ParamRef> params) const;

  struct Bucket {
    std::size_t offset = 0, size = 0;  // in the flat buffer; size is a multiple of DP
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  // The piece of parameter `param` at [param_offset, +length) sits at flat [flat_offset, +length).
  struct Piece {
    std::size_t param = 0, param_offset = 0, flat_offset = 0, length = 0;
  };
  void pack(std::span<const ParamRef> params, std::size_t bucket, bool values, std::span<float> out) const;
  void unpack(std::span<const ParamRef> params, std::size_t bucket, bool values, std::span<const float> in) const;
  std::size_t shard_begin(std::size_t bucket) const {
    return buckets_[bucket].offset + buckets_[bucket].size / dp_size_ * static_cast<std::size_t>(dp_rank_);
  }

  int dp_size_ = 1, dp_rank_ = 0;
  std::vector<std::size_t> offsets_;         // flat offset of each parameter
  std::vector<std::vector<std::size_t>> bucket_params_;  // parameters of each bucket
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> shard_base_;      // where each bucket's shard sits in shard_grads_
  std::vector<std::vector<Piece>> owned_;    // per bucket: the pieces inside this rank's shard
  std::vector<float> staging_, shard_grads_;  // one bucket; this rank's shards of every bucket
  // Overlap state: each bucket's own staging (reductions in flight at once), readiness per parameter.
  void start_bucket(std::size_t bucket);
  std::vector<std::size_t> bucket_of_;
  std::vector<std::vector<float>> bucket_staging_;
  std::vector<ParamRef> overlap_params_;
  Communicator* overlap_dp_ = nullptr;
  bool scatter_ = false, in_backward_ = false;
  std::vector<char> ready_;
  std::vector<std::size_t> missing_;
  std::size_t next_bucket_ = 0, started_early_ = 0;
};

}  // namespace dlm::train
