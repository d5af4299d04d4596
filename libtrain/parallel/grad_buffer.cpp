// The data-parallel gradient buffer and the distributed optimizer's shards (see grad_buffer.h).
#include "grad_buffer.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace dlm::train {

GradBuffer::GradBuffer(std::span<const ParamRef> params, int dp_size, int dp_rank, std::int64_t bucket_elements)
    : dp_size_(dp_size), dp_rank_(dp_rank), offsets_(params.size()) {
  if (dp_size <= 0 || dp_rank < 0 || dp_rank >= dp_size) fail(fmt::format("data-parallel rank {} of {}", dp_rank, dp_size));
  const auto limit = static_cast<std::size_t>(std::max<std::int64_t>(bucket_elements, 1));
  const auto d = static_cast<std::size_t>(dp_size);
  std::size_t offset = 0, filled = 0;
  std::vector<std::size_t> current;
  auto close = [&] {
    if (current.empty()) return;
    const std::size_t size = (filled + d - 1) / d * d;
    buckets_.push_back(Bucket{offset, size});
    bucket_params_.push_back(std::move(current));
    current.clear();
    offset += size;
    filled = 0;
  };
  for (std::size_t k = params.size(); k-- > 0;) {
    offsets_[k] = offset + filled;
    filled += params[k].value.size();
    current.push_back(k);
    if (filled >= limit) close();
  }
  close();
  std::size_t base = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    shard_base_.push_back(base);
    const std::size_t begin = shard_begin(b), end = begin + buckets_[b].size / d;
    owned_.emplace_back();
    for (std::size_t t : bucket_params_[b]) {
      const std::size_t lo = std::max(begin, offsets_[t]), hi = std::min(end, offsets_[t] + params[t].value.size());
      if (lo < hi) owned_.back().push_back(Piece{t, lo - offsets_[t], lo, hi - lo});
    }
    base += buckets_[b].size / d;
  }
  shard_grads_.assign(base, 0.0f);
  bucket_of_.resize(params.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (std::size_t t : bucket_params_[b]) bucket_of_[t] = b;
}

void GradBuffer::begin_overlap(std::span<const ParamRef> params, Communicator& dp, bool scatter) {
  overlap_params_.assign(params.begin(), params.end());
  overlap_dp_ = &dp;
  scatter_ = scatter;
  in_backward_ = true;
  ready_.assign(params.size(), 0);
  missing_.clear();
  for (const auto& members : bucket_params_) missing_.push_back(members.size());
  next_bucket_ = started_early_ = 0;
  bucket_staging_.resize(buckets_.size());
}

void GradBuffer::start_bucket(std::size_t b) {
  auto& staging = bucket_staging_[b];
  staging.resize(buckets_[b].size);
  pack(overlap_params_, b, false, staging);
  if (scatter_)
    overlap_dp_->reduce_scatter_async<float>(
        staging, std::span<float>(shard_grads_).subspan(shard_base_[b], buckets_[b].size / dp_size_));
  else
    overlap_dp_->all_reduce_async<float>(staging);
  if (in_backward_) ++started_early_;
}

void GradBuffer::mark_ready(std::size_t t) {
  if (!in_backward_ || t >= ready_.size() || ready_[t]) return;
  ready_[t] = 1;
  --missing_[bucket_of_[t]];
  while (next_bucket_ < buckets_.size() && missing_[next_bucket_] == 0) start_bucket(next_bucket_++);
  overlap_dp_->progress();
}

void GradBuffer::finish_overlap() {
  in_backward_ = false;
  while (next_bucket_ < buckets_.size()) start_bucket(next_bucket_++);
  overlap_dp_->wait_collectives();
  if (!scatter_)
    for (std::size_t b = 0; b < buckets_.size(); ++b) unpack(overlap_params_, b, false, bucket_staging_[b]);
}

void GradBuffer::pack(std::span<const ParamRef> params, std::size_t b, bool values, std::span<float> out) const {
  std::fill(out.begin(), out.end(), 0.0f);
  for (std::size_t t : bucket_params_[b]) {
    const auto src = values ? params[t].value : params[t].grad;
    std::memcpy(out.data() + (offsets_[t] - buckets_[b].offset), src.data(), src.size_bytes());
  }
}

void GradBuffer::unpack(std::span<const ParamRef> params, std::size_t b, bool values, std::span<const float> in) const {
  for (std::size_t t : bucket_params_[b]) {
    const auto dst = values ? params[t].value : params[t].grad;
    std::memcpy(dst.data(), in.data() + (offsets_[t] - buckets_[b].offset), dst.size_bytes());
  }
}

void GradBuffer::all_reduce_gradients(std::span<const ParamRef> params, Communicator& dp) {
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    staging_.resize(buckets_[b].size);
    pack(params, b, false, staging_);
    dp.all_reduce<float>(staging_);
    unpack(params, b, false, staging_);
  }
}

void GradBuffer::reduce_scatter_gradients(std::span<const ParamRef> params, Communicator& dp) {
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    staging_.resize(buckets_[b].size);
    pack(params, b, false, staging_);
    dp.reduce_scatter<float>(staging_, std::span<float>(shard_grads_).subspan(shard_base_[b], buckets_[b].size / dp_size_));
  }
}

std::vector<ParamRef> GradBuffer::shard_params(std::span<const ParamRef> params) {
  std::vector<ParamRef> out;
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (const Piece& p : owned_[b]) {
      const ParamRef& whole = params[p.param];
      out.push_back(ParamRef{whole.name, whole.value.subspan(p.param_offset, p.length),
                             std::span<float>(shard_grads_).subspan(shard_base_[b] + p.flat_offset - shard_begin(b), p.length),
                             whole.decay, {}, whole.in_grad_norm});
    }
  return out;
}

void GradBuffer::all_gather_weights(std::span<const ParamRef> params, Communicator& dp) {
  std::vector<float> mine;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    mine.assign(buckets_[b].size / dp_size_, 0.0f);
    for (const Piece& p : owned_[b])
      std::memcpy(mine.data() + (p.flat_offset - shard_begin(b)), params[p.param].value.data() + p.param_offset,
                  p.length * sizeof(float));
    staging_.resize(buckets_[b].size);
    dp.all_gather<float>(mine, staging_);
    unpack(params, b, true, staging_);
  }
}

AdamW GradBuffer::gather_optimizer(const AdamW& shard, std::span<const ParamRef> params, Communicator& dp) const {
  AdamW full(shard.options());
  full.set_steps(shard.steps());
  if (shard.exp_avg().empty()) return full;
  for (const auto& p : params) {
    full.exp_avg().emplace_back(p.value.size(), 0.0f);
    full.exp_avg_sq().emplace_back(p.value.size(), 0.0f);
  }
  std::vector<float> mine, all;
  for (int moment = 0; moment < 2; ++moment) {
    const auto& src = moment == 0 ? shard.exp_avg() : shard.exp_avg_sq();
    auto& dst = moment == 0 ? full.exp_avg() : full.exp_avg_sq();
    std::size_t k = 0;  // piece index: the order of shard_params()
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      mine.assign(buckets_[b].size / dp_size_, 0.0f);
      for (const Piece& p : owned_[b]) {
        std::memcpy(mine.data() + (p.flat_offset - shard_begin(b)), src.at(k).data(), p.length * sizeof(float));
        ++k;
      }
      all.resize(buckets_[b].size);
      dp.all_gather<float>(mine, all);
      for (std::size_t t : bucket_params_[b])
        std::memcpy(dst[t].data(), all.data() + (offsets_[t] - buckets_[b].offset), dst[t].size() * sizeof(float));
    }
  }
  return full;
}

AdamW GradBuffer::shard_optimizer(const AdamW& full, std::span<const ParamRef> params) const {
  AdamW shard(full.options());
  shard.set_steps(full.steps());
  if (full.exp_avg().empty()) return shard;
  if (full.exp_avg().size() != params.size())
    fail(fmt::format("optimizer state for {} tensors, the model has {}", full.exp_avg().size(), params.size()));
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (const Piece& p : owned_[b]) {
      const auto& m = full.exp_avg()[p.param];
      const auto& v = full.exp_avg_sq()[p.param];
      shard.exp_avg().emplace_back(m.begin() + static_cast<std::ptrdiff_t>(p.param_offset),
                                   m.begin() + static_cast<std::ptrdiff_t>(p.param_offset + p.length));
      shard.exp_avg_sq().emplace_back(v.begin() + static_cast<std::ptrdiff_t>(p.param_offset),
                                      v.begin() + static_cast<std::ptrdiff_t>(p.param_offset + p.length));
    }
  return shard;
}

}  // namespace dlm::train
