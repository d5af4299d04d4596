// A mixture-of-experts layer's MLP (docs/moe.md): router logits = b Wr^T on the backend, routing on the host
// (moe_router.h: the logits are [N, E], small), the experts as one backend op (moe_experts_*), and with a shared
// expert (Megatron's SharedExpertMLP, ungated) its SwiGLU of every token added: y = routed + (silu(b G^T) * b U^T) D^T.
//
// Tensor parallelism (expert tensor parallelism = TP, megatron-core's default): b is the N-row input the dense MLP's
// column-parallel fc1 reads (all-gathered under SP). Each expert's fc1 and the shared expert's are column-parallel
// shards and their fc2 row-parallel ones (sharding.h), so routed + shared is this rank's partial sum, reduced as the
// dense fc2's output is (all-reduce, or reduce-scatter under SP). The router is replicated and reads the same b on
// every tensor rank, so every tensor rank routes (and, under EP, dispatches) the same tokens the same way. Hence:
//   dw[n, j] = dout[n] . y[n, j] is summed over the tensor group (each rank's y[n, j] is its partial sum);
//   the router's weight gradient dlogits^T b is whole on every rank: not summed, in the gradient norm once (model.cpp);
//   its input gradient dlogits Wr joins d b on tensor rank 0 only, before d b's sum over the tensor group;
//   the aux/z losses and loads are recorded on tensor rank 0 only (the trainer sums the metrics over the model).
// Under SP the pipeline pads rows that do not split over the tensor ranks (key_valid 0; pipeline_schedule.cpp): the
// router leaves those rows out, so its losses, loads and capacity are the unpadded batch's; a pad row's slots go to
// expert 0 with weight 0 and get no gradient.
#include <algorithm>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "model_internal.h"

namespace dlm::train {

namespace {

// The values of `rows` of a row-major [., width] matrix, and back.
template <typename T>
std::vector<T> take_rows(std::span<const T> all, std::span<const std::int64_t> rows, std::int64_t width) {
  std::vector<T> out(rows.size() * static_cast<std::size_t>(width));
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::copy_n(all.begin() + rows[i] * width, width, out.begin() + static_cast<std::int64_t>(i) * width);
  return out;
}
template <typename T>
void put_rows(std::span<const T> some, std::span<const std::int64_t> rows, std::int64_t width, std::span<T> all) {
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::copy_n(some.begin() + static_cast<std::int64_t>(i) * width, width, all.begin() + rows[i] * width);
}

// Routes every row of `logits` [N, E], or only `rows` (their routing in `real`) spread over all N with weight 0 on
// expert 0 for the others.
Routing route_rows(const RouterOptions& options, std::span<const std::int64_t> rows, std::span<const float> logits,
                   Routing& real) {
  if (rows.empty()) return route(options, logits);
  const std::int64_t E = options.experts, k = options.topk;
  real = route(options, take_rows(logits, rows, E));
  Routing all = real;  // the losses and loads are the real rows'
  all.tokens = static_cast<std::int64_t>(logits.size()) / E;
  all.experts.assign(static_cast<std::size_t>(all.tokens * k), 0);
  all.weights.assign(all.experts.size(), 0.0f);
  put_rows<std::int32_t>(real.experts, rows, k, all.experts);
  put_rows<float>(real.weights, rows, k, all.weights);
  if (!real.kept.empty()) {
    all.kept.assign(all.experts.size(), 0);
    put_rows<std::uint8_t>(real.kept, rows, k, all.kept);
  }
  return all;
}

// route_backward() of route_rows(): the rows' logits' gradient from their routing, 0 for the others.
void route_rows_backward(const RouterOptions& options, std::span<const std::int64_t> rows, const Routing& real,
                         const Routing& all, std::span<const float> dweights, double loss_weight,
                         std::span<float> dlogits) {
  if (rows.empty()) return route_backward(options, all, dweights, loss_weight, dlogits);
  const std::int64_t E = options.experts, k = options.topk;
  std::vector<float> real_dlogits(rows.size() * static_cast<std::size_t>(E));
  route_backward(options, real, take_rows(dweights, rows, k), loss_weight, real_dlogits);
  std::fill(dlogits.begin(), dlogits.end(), 0.0f);
  put_rows<float>(real_dlogits, rows, E, dlogits);
}

}  // namespace

void Model::moe_forward(std::size_t l, const Tensor& out) {
  const Layer& P = layers_[l];
  Activations& a = *acts_;
  auto& A = a.layers[l];
  Backend& be = backend_;
  const Tensor& b = column_input(A.xn2, A.xn2g);
  be.linear_forward(b, params_[P.router].value, A.router_logits);
  std::vector<float> logits(static_cast<std::size_t>(A.router_logits.numel()));
  be.copy_to_host(A.router_logits, logits);
  A.routing = route_rows(RouterOptions::of(config_), a.routed_rows, logits, A.real_routing);
  if (!shard_.tensor || shard_.tensor->rank() == 0) {
    // Megatron tracks the losses without their coefficients (moe_metrics.h).
    const std::size_t width = static_cast<std::size_t>(2 + config_.num_experts);
    if (moe_sums_.empty()) moe_sums_.assign(static_cast<std::size_t>(config_.num_layers) * width, 0.0);
    double* sums = moe_sums_.data() + static_cast<std::size_t>(first_layer_ + static_cast<int>(l)) * width;
    if (config_.moe_aux_loss_coeff > 0) sums[0] += A.routing.aux_loss / config_.moe_aux_loss_coeff;
    if (config_.moe_z_loss_coeff > 0) sums[1] += A.routing.z_loss / config_.moe_z_loss_coeff;
    for (std::size_t e = 0; e + 2 < width; ++e) sums[e + 2] += static_cast<double>(A.routing.tokens_per_expert[e]);
  }
  const Tensor& partial = shard_.sequence_parallel ? a.partial : out;
  if (shard_.expert) {
    expert_parallel_forward(l, b, partial);
  } else {
    be.copy_from_host(A.moe_experts, std::span<const std::int32_t>(A.routing.experts));
    be.copy_from_host(A.moe_weights, std::span<const float>(A.routing.weights));
    be.moe_experts_forward(b, A.moe_experts, A.moe_weights, params_[P.experts_fc1].value, params_[P.experts_fc2].value,
                           partial, A.gate_up, A.act);
  }
  if (P.fc1 >= 0) {
    be.linear_forward(b, params_[P.fc1].value, A.shared_gate_up);
    be.swiglu_forward(A.shared_gate_up, A.shared_act);
    be.linear_forward(A.shared_act, params_[P.fc2].value, a.shared_out);
    be.add(partial, a.shared_out);
  }
  row_output(partial, out);
}

// d loss / d(layer output) is a.dx; leaves d loss / d b in a.dxn (a.dfull, a.dxn_full and a.dtmp_full are scratch).
void Model::moe_backward(std::size_t l) {
  Activations& a = *acts_;
  const Layer& P = layers_[l];
  auto& A = a.layers[l];
  Backend& be = backend_;
  row_output_backward(a.dx, a.dfull);
  const Tensor& b = gathered(A.xn2, A.xn2g);
  if (shard_.expert)
    expert_parallel_backward(l, a.dfull, a.dxn_full);
  else
    be.moe_experts_backward(a.dfull, b, A.moe_experts, A.moe_weights, params_[P.experts_fc1].value,
                            params_[P.experts_fc2].value, A.gate_up, A.act, a.dxn_full, a.dmoe_weights,
                            params_[P.experts_fc1].grad, params_[P.experts_fc2].grad);
  tp_all_reduce(a.dmoe_weights);
  std::vector<float> dweights(static_cast<std::size_t>(a.dmoe_weights.numel()));
  be.copy_to_host(a.dmoe_weights, dweights);
  std::vector<float> dlogits(static_cast<std::size_t>(a.drouter_logits.numel()));
  route_rows_backward(RouterOptions::of(config_), a.routed_rows, A.real_routing, A.routing, dweights,
                      router_loss_weight_, dlogits);
  be.copy_from_host(a.drouter_logits, std::span<const float>(dlogits));
  be.linear_backward(a.drouter_logits, b, params_[P.router].value, a.dtmp_full, params_[P.router].grad);
  if (!shard_.tensor || shard_.tensor->rank() == 0) be.add(a.dxn_full, a.dtmp_full);
  if (P.fc1 >= 0) {
    be.linear_backward(a.dfull, A.shared_act, params_[P.fc2].value, a.dshared_act, params_[P.fc2].grad);
    be.swiglu_backward(a.dshared_act, A.shared_gate_up, a.dshared_gate_up);
    be.linear_backward(a.dshared_gate_up, b, params_[P.fc1].value, a.dtmp_full, params_[P.fc1].grad);
    be.add(a.dxn_full, a.dtmp_full);
  }
  column_input_backward(a.dxn_full, a.dxn);
}

MoeStepSums Model::take_moe_sums() {
  MoeStepSums s;
  if (config_.num_experts == 0) return s;
  s.experts = config_.num_experts;
  s.load_balancing = config_.moe_aux_loss_coeff > 0;
  s.z = config_.moe_z_loss_coeff > 0;
  s.values = std::move(moe_sums_);
  s.values.resize(static_cast<std::size_t>(config_.num_layers) * static_cast<std::size_t>(2 + s.experts), 0.0);
  moe_sums_.clear();
  return s;
}

std::vector<Model::MoeLayerStats> Model::moe_stats() const {
  std::vector<MoeLayerStats> out;
  if (!acts_) return out;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    if (!layers_[l].moe()) continue;
    const Routing& r = acts_->layers[l].routing;
    out.push_back({first_layer_ + static_cast<int>(l), r.aux_loss, r.z_loss, r.tokens_per_expert, r.aux_probability_sum});
  }
  return out;
}

}  // namespace dlm::train
