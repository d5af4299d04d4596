// layer_norm_sums.h: the norm's partial sums by layer.
#include "layer_norm_sums.h"

namespace dlm::train::cuda {

void LayerNormSums::build(const ParameterStore& params, const std::vector<int>& layer_of_spec, int layers) {
  layer_.assign(static_cast<std::size_t>(layers), {});
  rest_.clear(), all_.clear();
  state_ = kOff;
  const auto& spec = params.norm_chunk_spec;
  if (!spec.empty()) all_.push_back({0, static_cast<int>(spec.size())});
  // Runs of consecutive chunks of one layer (or of none).
  for (std::size_t i = 0; i < spec.size();) {
    const int l = layer_of_spec[static_cast<std::size_t>(spec[i])];
    std::size_t j = i + 1;
    while (j < spec.size() && layer_of_spec[static_cast<std::size_t>(spec[j])] == l) ++j;
    const Run run{static_cast<int>(i), static_cast<int>(j - i)};
    (l >= 0 ? layer_[static_cast<std::size_t>(l)] : rest_).push_back(run);
    i = j;
  }
}

void LayerNormSums::enqueue(const std::vector<Run>& runs, const ParameterStore& params, cudaStream_t stream) const {
  for (const Run& r : runs)
    grad_sumsq_partials(params.adam_dev, params.norm_chunks + r.first, r.count, params.norm_partial + r.first, stream);
}

void LayerNormSums::layer_done(int l, const ParameterStore& params, cudaStream_t main) {
  if (state_ != kTaking || l < 0 || l >= static_cast<int>(layer_.size()) || layer_[static_cast<std::size_t>(l)].empty())
    return;
  if (!side_) side_ = std::make_unique<SideStream>();
  side_->fork(main);
  enqueue(layer_[static_cast<std::size_t>(l)], params, side_->get());
}

void LayerNormSums::enqueue_sumsq(const ParameterStore& params, cudaStream_t main) {
  join(main);
  enqueue(state_ == kTaken ? rest_ : all_, params, main);
  sum_grad_partials(params.norm_partial, params.num_norm_chunks, params.sumsq, main);
}

}  // namespace dlm::train::cuda
