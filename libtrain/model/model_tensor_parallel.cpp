// Model's tensor-parallel plumbing: the collectives around column- and row-parallel linears (with and
// without sequence parallelism), the vocab-parallel embedding's ids and cross-entropy, and the sum of
// replicated tensors' partial gradients. Megatron's mappings (tensor_parallel/mappings.py), per token row:
//   column input   no SP: y = x (fwd), dx = sum_r dx_r (bwd: all-reduce)
//                  SP:    x_full = all-gather of the ranks' rows (fwd), dx_r = rows r of sum_r dx (reduce-scatter)
//   row output     no SP: y = sum_r y_r (all-reduce), dy_r = dy (bwd: identity)
//                  SP:    y_rows_r = rows r of sum_r y_r (reduce-scatter), dy_full = all-gather (bwd)
// The collectives take the backend's memory: a communicator must address the memory of the backend it
// serves (MPI: host, NCCL: device).
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "model_internal.h"

namespace dlm::train {
void Model::tp_all_reduce(const Tensor& t) const {
  if (shard_.layout.tp > 1) shard_.tensor->all_reduce(f32_elements(t));
}

void Model::gather_rows(const Tensor& local, const Tensor& full) const {
  shard_.tensor->all_gather<float>(f32_elements(local), f32_elements(full));
}

void Model::scatter_rows_sum(const Tensor& full, const Tensor& local) const {
  shard_.tensor->reduce_scatter<float>(f32_elements(full), f32_elements(local));
}

const Tensor& Model::column_input(const Tensor& local, const Tensor& full) const {
  if (!shard_.sequence_parallel) return local;
  gather_rows(local, full);
  return full;
}

void Model::column_input_backward(const Tensor& dfull, const Tensor& dlocal) const {
  if (shard_.sequence_parallel) scatter_rows_sum(dfull, dlocal);
  else tp_all_reduce(dfull);  // dfull and dlocal are the same tensor
}

void Model::row_output(const Tensor& partial, const Tensor& out) const {
  if (shard_.sequence_parallel) scatter_rows_sum(partial, out);
  else tp_all_reduce(out);  // partial and out are the same tensor
}

void Model::row_output_backward(const Tensor& dlocal, const Tensor& dfull) const {
  if (shard_.sequence_parallel) gather_rows(dlocal, dfull);
}

void Model::vocab_parallel_ids(std::span<const std::int32_t> ids, std::vector<std::int32_t>& local) const {
  const std::int64_t rows = config_.padded_vocab_size() / shard_.layout.tp;
  local.resize(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t r = ids[i] - vocab_begin_;
    local[i] = r >= 0 && r < rows ? static_cast<std::int32_t>(r) : -1;  // -1: a zero row, no gradient
  }
}

// Megatron's VocabParallelCrossEntropy: each rank's logits cover the columns [v0, v0 + V/TP) of the
// padded vocabulary. With lse_r = log sum_{j in r, j < vocab} exp(l_j) (the backend's cross-entropy over
// the rank's real columns), lse = M + log sum_r exp(lse_r - M), M = max_r lse_r; the label's logit comes
// from the one rank holding it (l_label = lse_r - ce_r there, 0 elsewhere, summed). ce = lse - l_label.
std::vector<float> Model::vocab_parallel_cross_entropy(std::span<const std::int32_t> labels) {
  Activations& a = *acts_;
  const auto n = static_cast<std::size_t>(a.batch * a.seq);
  const std::int64_t real =
      std::clamp<std::int64_t>(config_.vocab_size - vocab_begin_, 0, config_.padded_vocab_size() / shard_.layout.tp);
  std::vector<std::int32_t> local(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t r = labels[i] - vocab_begin_;
    local[i] = labels[i] >= 0 && r >= 0 && r < real ? static_cast<std::int32_t>(r) : -1;
  }
  std::vector<float> lse(n, -std::numeric_limits<float>::infinity()), ce_local(n, 0.0f);
  if (real > 0) {
    backend_.copy_from_host(a.labels_local, std::span<const std::int32_t>(local));
    backend_.cross_entropy_forward(a.logits, a.labels_local, real, a.ce, a.ce_lse);
    backend_.copy_to_host(a.ce_lse, lse);
    backend_.copy_to_host(a.ce, ce_local);
  }
  std::vector<float> top(lse);
  shard_.tensor->all_reduce(std::span<float>(top), ReduceOp::kMax);
  std::vector<double> sums(2 * n);  // [sum_r exp(lse_r - M) | label logit]
  for (std::size_t i = 0; i < n; ++i) {
    sums[i] = real > 0 ? std::exp(double(lse[i]) - top[i]) : 0.0;
    sums[n + i] = local[i] >= 0 ? double(lse[i]) - ce_local[i] : 0.0;
  }
  shard_.tensor->all_reduce(std::span<double>(sums));
  std::vector<float> ce(n), whole_lse(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double l = top[i] + std::log(sums[i]);
    whole_lse[i] = static_cast<float>(l);
    ce[i] = labels[i] < 0 ? 0.0f : static_cast<float>(l - sums[n + i]);
  }
  backend_.copy_from_host(a.ce_lse, std::span<const float>(whole_lse));  // backward's softmax uses it
  return ce;
}

// Under SP every norm saw 1/TP of the rows; QK-norm weights always see only the rank's heads.
bool gradient_summed_over_tensor_group(std::string_view name, bool is_norm, int tp, bool sequence_parallel) {
  if (tp == 1 || !is_norm) return false;
  return name.ends_with("q_layernorm.weight") || name.ends_with("k_layernorm.weight") || sequence_parallel;
}

bool Model::gradient_shared_over_tensor_group(const Parameter& p) const {
  return gradient_summed_over_tensor_group(p.spec.name, p.spec.is_norm, shard_.layout.tp, shard_.sequence_parallel);
}

void Model::reduce_shared_gradients() {
  for (auto& p : params_)
    if (gradient_shared_over_tensor_group(p)) tp_all_reduce(p.grad);
}

}  // namespace dlm::train
