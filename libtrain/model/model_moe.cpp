// A mixture-of-experts layer's MLP (docs/moe.md): router logits = b Wr^T on the backend, routing on the host
// (moe_router.h: the logits are [N, E], small), the experts as one backend op (moe_experts_*), and with a shared
// expert (Megatron's SharedExpertMLP, ungated) its SwiGLU of every token added: y = routed + (silu(b G^T) * b U^T) D^T.
// MoE layers run without tensor parallelism (ParallelLayout::validate), so b is the whole A.xn2.
#include <fmt/format.h>

#include "dlm/common/error.h"
#include "model_internal.h"

namespace dlm::train {

void Model::moe_forward(std::size_t l, const Tensor& out) {
  const Layer& P = layers_[l];
  auto& A = acts_->layers[l];
  Backend& be = backend_;
  be.linear_forward(A.xn2, params_[P.router].value, A.router_logits);
  std::vector<float> logits(static_cast<std::size_t>(A.router_logits.numel()));
  be.copy_to_host(A.router_logits, logits);
  A.routing = route(RouterOptions::of(config_), logits);
  // Megatron tracks the losses without their coefficients (moe_metrics.h).
  const std::size_t width = static_cast<std::size_t>(2 + config_.num_experts);
  if (moe_sums_.empty()) moe_sums_.assign(static_cast<std::size_t>(config_.num_layers) * width, 0.0);
  double* sums = moe_sums_.data() + static_cast<std::size_t>(first_layer_ + static_cast<int>(l)) * width;
  if (config_.moe_aux_loss_coeff > 0) sums[0] += A.routing.aux_loss / config_.moe_aux_loss_coeff;
  if (config_.moe_z_loss_coeff > 0) sums[1] += A.routing.z_loss / config_.moe_z_loss_coeff;
  for (std::size_t e = 0; e + 2 < width; ++e) sums[e + 2] += static_cast<double>(A.routing.tokens_per_expert[e]);
  if (shard_.expert) {
    expert_parallel_forward(l, out);
  } else {
    be.copy_from_host(A.moe_experts, std::span<const std::int32_t>(A.routing.experts));
    be.copy_from_host(A.moe_weights, std::span<const float>(A.routing.weights));
    be.moe_experts_forward(A.xn2, A.moe_experts, A.moe_weights, params_[P.experts_fc1].value,
                           params_[P.experts_fc2].value, out, A.gate_up, A.act);
  }
  if (P.fc1 < 0) return;
  Activations& a = *acts_;
  be.linear_forward(A.xn2, params_[P.fc1].value, A.shared_gate_up);
  be.swiglu_forward(A.shared_gate_up, A.shared_act);
  be.linear_forward(A.shared_act, params_[P.fc2].value, a.shared_out);
  be.add(out, a.shared_out);
}

// d loss / d(layer output) is a.dx; leaves d loss / d b in a.dxn (a.dtmp is scratch).
void Model::moe_backward(std::size_t l) {
  Activations& a = *acts_;
  const Layer& P = layers_[l];
  auto& A = a.layers[l];
  Backend& be = backend_;
  if (shard_.expert)
    expert_parallel_backward(l);
  else
    be.moe_experts_backward(a.dx, A.xn2, A.moe_experts, A.moe_weights, params_[P.experts_fc1].value,
                            params_[P.experts_fc2].value, A.gate_up, A.act, a.dxn, a.dmoe_weights,
                            params_[P.experts_fc1].grad, params_[P.experts_fc2].grad);
  std::vector<float> dweights(static_cast<std::size_t>(a.dmoe_weights.numel()));
  be.copy_to_host(a.dmoe_weights, dweights);
  std::vector<float> dlogits(static_cast<std::size_t>(a.drouter_logits.numel()));
  route_backward(RouterOptions::of(config_), A.routing, dweights, router_loss_weight_, dlogits);
  be.copy_from_host(a.drouter_logits, std::span<const float>(dlogits));
  be.linear_backward(a.drouter_logits, A.xn2, params_[P.router].value, a.dtmp, params_[P.router].grad);
  be.add(a.dxn, a.dtmp);
  if (P.fc1 < 0) return;
  be.linear_backward(a.dx, A.shared_act, params_[P.fc2].value, a.dshared_act, params_[P.fc2].grad);
  be.swiglu_backward(a.dshared_act, A.shared_gate_up, a.dshared_gate_up);
  be.linear_backward(a.dshared_gate_up, A.xn2, params_[P.fc1].value, a.dtmp, params_[P.fc1].grad);
  be.add(a.dxn, a.dtmp);
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
