// CudaModel's MoE layers (moe_layer.h): their buffers, and the forward and backward of one layer's MLP.
#include <algorithm>

#include "cuda_model_impl.h"
#include "dlm/train/moe_router.h"
#include "moe_kernels.h"

namespace dlm::train {

namespace cuda {

void MoeBuffers::allocate(const MoeShape& shape, std::int64_t tokens) {
  release();
  shape_ = shape, tokens_ = tokens;
  const std::int64_t E = shape.experts, rows = tokens * shape.topk, F = shape.ffn, d = shape.hidden;
  const std::int64_t S = shape.shared;
  MoeWork& w = work_;
  w.ys = arena_.alloc<bf16>(rows * d), w.dys = arena_.alloc<bf16>(rows * d);
  w.dact = arena_.alloc<bf16>(rows * F), w.dgu = arena_.alloc<bf16>(rows * 2 * F);
  if (S > 0) {
    w.shared_dact = arena_.alloc<bf16>(tokens * S), w.shared_dgu = arena_.alloc<bf16>(tokens * 2 * S);
    w.shared_out = arena_.alloc<bf16>(tokens * d);
  }
  w.dlogits = arena_.alloc<bf16>(tokens * E);
  w.dw = arena_.alloc<float>(rows);
  w.sort = arena_.alloc<int>(cuda::moe_sort_scratch_ints(rows, shape.experts));
}

int MoeShape::capacity(std::int64_t tokens) const {
  return static_cast<int>(expert_capacity(tokens * topk, experts, capacity_factor));
}

void MoeBuffers::release() {
  arena_.release();
  slots_.clear();
  last_offsets.clear();
  last_capacity.clear();
  work_ = MoeWork{};
  tokens_ = 0;
}

MoeLayerActs* MoeBuffers::layer(int s, int l) {
  if (static_cast<int>(slots_.size()) <= s) slots_.resize(static_cast<std::size_t>(s) + 1);
  auto& layers = slots_[static_cast<std::size_t>(s)];
  if (static_cast<int>(layers.size()) <= l) layers.resize(static_cast<std::size_t>(l) + 1);
  auto& m = layers[static_cast<std::size_t>(l)];
  if (m) return m.get();
  m = std::make_unique<MoeLayerActs>();
  const std::int64_t E = shape_.experts, k = shape_.topk, rows = tokens_ * k, F = shape_.ffn, d = shape_.hidden;
  m->logits = arena_.alloc<float>(tokens_ * E), m->w = arena_.alloc<float>(rows);
  m->idx = arena_.alloc<int>(rows), m->where = arena_.alloc<int>(rows), m->order = arena_.alloc<int>(rows);
  m->offsets = arena_.alloc<int>(E + 1);
  if (shape_.capacity_factor > 0) m->kept = arena_.alloc<std::uint8_t>(rows);
  m->xs = arena_.alloc<bf16>(rows * d);
  m->gu = arena_.alloc<bf16>(rows * 2 * F), m->act = arena_.alloc<bf16>(rows * F);
  if (const std::int64_t S = shape_.shared; S > 0)
    m->shared_gu = arena_.alloc<bf16>(tokens_ * 2 * S), m->shared_act = arena_.alloc<bf16>(tokens_ * S);
  const auto per_gemm = static_cast<std::int64_t>(grouped_args_bytes(static_cast<int>(E)));
  char* gemms = arena_.alloc<char>(kMoeGemms * per_gemm);
  for (int g = 0; g < kMoeGemms; ++g) m->gemms[g] = grouped_args_at(gemms + g * per_gemm, static_cast<int>(E));
  return m.get();
}

}  // namespace cuda

namespace {

using Impl = CudaModel::Impl;

RouterShape router_shape(const Impl& I, int tokens) {
  const auto& c = I.cfg;
  return {tokens, c.num_experts, c.moe_router_topk, c.moe_router_score_function == ckpt::MoeScoreFunction::kSigmoid,
          c.moe_norm_topk_prob};
}

// The layer's rows on this GPU, grouped by all E experts (the sort's offsets).
ExpertRows local_rows(Impl& I, MoeLayerActs& M) {
  MoeWork& w = I.moe.work();
  return {M.offsets, I.moe.shape().experts, M.xs, M.gu, M.act, w.ys, w.dys, w.dact, w.dgu, w.ys, M.gemms};
}

}  // namespace

// Every grouped GEMM's per-group shapes, addresses and strides for this layer's forward and backward, filled on the
// device from the groups' offsets (grouped_gemm.h). A group's rows of an [R, ld] matrix, or its expert's slice of
// an [E, ...] weight (bf16) or weight gradient (fp32); this rank's experts are the groups, in order:
void plan_expert_gemms(Impl& I, const LayerParams& P, const ExpertRows& r) {
  const MoeShape& s = I.moe.shape();
  const int d = s.hidden, F = s.ffn;
  const auto rows = [](const void* base, int ld) { return GroupedOperand{base, ld, 0, ld, 2}; };
  const auto expert = [](const void* base, std::int64_t size, int ld, int bytes) {
    return GroupedOperand{base, 0, size, ld, bytes};
  };
  const bf16 *w1 = I.params.W(P.experts_fc1), *w2 = I.params.W(P.experts_fc2);
  const float *g1 = I.params.G(P.experts_fc1), *g2 = I.params.G(P.experts_fc2);
  const std::int64_t W1 = 2LL * F * d, W2 = static_cast<std::int64_t>(d) * F;
  GroupedPlan p[kMoeGemms];
  const auto set = [&](MoeGemm g, GroupedOperand a, GroupedOperand b, GroupedOperand c, int m, int n, int k) {
    p[g] = {a, b, c, m, n, k, r.gemms[g]};
  };
  // m, n, k: 0 stands for the group's rows.
  set(kMoeFc1, rows(r.x, d), expert(w1, W1, d, 2), rows(r.gu, 2 * F), 0, 2 * F, d);          // x W1_e^T
  set(kMoeFc2, rows(r.act, F), expert(w2, W2, F, 2), rows(r.y, d), 0, d, F);                 // act W2_e^T
  set(kMoeFc2Data, rows(r.dy, d), expert(w2, W2, F, 2), rows(r.dact, F), 0, F, d);           // dy W2_e
  set(kMoeFc2Weight, rows(r.dy, d), rows(r.act, F), expert(g2, W2, F, 4), d, F, 0);          // += dy^T act
  set(kMoeFc1Weight, rows(r.dgu, 2 * F), rows(r.x, d), expert(g1, W1, d, 4), 2 * F, d, 0);   // += dgu^T x
  set(kMoeFc1Data, rows(r.dgu, 2 * F), expert(w1, W1, d, 2), rows(r.dx, d), 0, d, 2 * F);    // dgu W1_e
  grouped_plan(p, kMoeGemms, r.offsets, r.groups, I.stream);
}

// A weight gradient's grouped GEMM (kMoeFc*Weight): the first into the gradient since zero_grad overwrites it (the
// gradient freshness of grad_freshness.h), its empty groups cleared after it; later ones add.
void run_expert_gemm(Impl& I, const LayerParams& P, const ExpertRows& r, MoeGemm g) {
  switch (g) {
    case kMoeFc1:
    case kMoeFc2: return I.grouped->run(GroupedForm::kNT, r.groups, r.gemms[g], I.stream);
    case kMoeFc2Data:
    case kMoeFc1Data: return I.grouped->run(GroupedForm::kNN, r.groups, r.gemms[g], I.stream);
    default: break;
  }
  const MoeShape& s = I.moe.shape();
  const bool fc2 = g == kMoeFc2Weight;
  const int p = fc2 ? P.experts_fc2 : P.experts_fc1;
  const std::int64_t per_expert = (fc2 ? 1LL : 2LL) * s.ffn * s.hidden;
  const float beta = I.grad_beta(p);
  I.grouped->run(GroupedForm::kTNAccumulate, r.groups, r.gemms[g], I.stream, beta);
  if (beta == 0.0f) moe_clear_empty_experts(I.params.G(p), r.offsets, r.groups, per_expert, I.stream);
}

void enqueue_moe_forward(Impl& I, LayerActs& A, int l, int tokens, bool recompute) {
  const auto& P = I.lp[static_cast<std::size_t>(l)];
  MoeLayerActs& M = *A.moe;
  MoeWork& w = I.moe.work();
  const MoeShape& s = I.moe.shape();
  const int E = s.experts, k = s.topk, F = s.ffn, d = s.hidden, rows = tokens * k;
  const cudaStream_t st = I.stream;
  auto mark = [&](const char* phase) {
    if (!recompute) I.timer.mark(phase, st);
  };
  // The shared expert on the side stream, beside the routing and the routed experts: its output (not under
  // `recompute`, which needs its activations only) is added by the combine, after the join.
  const int S = s.shared;
  if (S > 0) {
    const cudaStream_t side = I.moe_side->get();
    Gemm& gm = *I.moe_side_gemm;
    I.moe_side->fork(st);
    gm.run(false, true, tokens, 2 * S, d, A.h2, d, I.params.W(P.fc1), d, M.shared_gu, false, 2 * S, 0, side);
    swiglu_forward(M.shared_gu, M.shared_act, tokens, S, side);
    if (!recompute)
      gm.run(false, true, tokens, d, S, M.shared_act, S, I.params.W(P.fc2), S, w.shared_out, false, d, 0, side);
  }
  I.gemm->run(false, true, tokens, E, d, A.h2, d, I.params.W(P.router), d, M.logits, true, E, 0, st);
  moe_router_forward(router_shape(I, tokens), M.logits, M.idx, M.w, st);
  mark("moe router fwd");
  moe_sort_by_expert(M.idx, rows, E, w.sort, M.offsets, M.where, M.order, st);
  const int capacity = s.capacity(tokens);
  if (capacity > 0) moe_drop_over_capacity(M.idx, M.order, M.offsets, rows, capacity, s.drop_by_position, M.w, M.kept, st);
  auto& last = I.moe.last_offsets;
  if (static_cast<int>(last.size()) <= l) last.resize(static_cast<std::size_t>(l) + 1, nullptr);
  last[static_cast<std::size_t>(l)] = M.offsets;
  auto& caps = I.moe.last_capacity;
  if (static_cast<int>(caps.size()) <= l) caps.resize(static_cast<std::size_t>(l) + 1, 0);
  caps[static_cast<std::size_t>(l)] = capacity;
  if (I.shard.expert) {
    enqueue_expert_parallel_forward(I, A, l, tokens);  // dispatch, local experts, combine: outputs in ys (moe_dispatch.h)
    mark("moe expert-parallel experts fwd (counts exchange: host wait)");
  } else {
    const ExpertRows r = local_rows(I, M);
    plan_expert_gemms(I, P, r);
    moe_expand(A.h2, M.where, tokens, k, d, M.xs, st);
    mark("moe permute");
    run_expert_gemm(I, P, r, kMoeFc1);
    mark("moe grouped fc1 fwd");
    moe_swiglu_forward(M.gu, M.w, M.order, rows, F, M.act, st);
    mark("moe swiglu fwd");
    if (!recompute) {
      run_expert_gemm(I, P, r, kMoeFc2);
      mark("moe grouped fc2 fwd");
    }
  }
  if (recompute) {
    if (S > 0) I.moe_side->join(st);
    return;
  }
  if (S > 0) I.moe_side->join(st);
  moe_combine(w.ys, M.where, tokens, k, d, S > 0 ? w.shared_out : nullptr, I.acts.shared.tmp, st);
  mark("moe combine fwd (+ the shared expert's output)");
}

void enqueue_moe_backward(Impl& I, const MicroInputs& in, LayerActs& A, int l) {
  const auto& P = I.lp[static_cast<std::size_t>(l)];
  MoeLayerActs& M = *A.moe;
  MoeWork& w = I.moe.work();
  SharedActs& sh = I.acts.shared;
  const MoeShape& s = I.moe.shape();
  const int T = static_cast<int>(I.acts.T), E = s.experts, k = s.topk, F = s.ffn, d = s.hidden, rows = T * k;
  const cudaStream_t st = I.stream;
  auto mark = [&](const char* phase) { I.timer.mark(phase, st); };
  // The shared expert's backward on the side stream, beside the routed experts'; the combine adds its data
  // gradient, after the join.
  const int S = s.shared;
  if (S > 0) {
    const cudaStream_t side = I.moe_side->get();
    Gemm& gm = *I.moe_side_gemm;
    const ParameterStore& ps = I.params;
    I.moe_side->fork(st);
    gm.run(true, false, d, S, T, sh.dres16_full, d, M.shared_act, S, ps.G(P.fc2), true, S, I.grad_beta(P.fc2), side);
    gm.run(false, false, T, S, d, sh.dres16_full, d, ps.W(P.fc2), S, w.shared_dact, false, S, 0, side);
    swiglu_backward(w.shared_dact, M.shared_gu, w.shared_dgu, T, S, side);
    gm.run(true, false, 2 * S, d, T, w.shared_dgu, 2 * S, A.h2, d, ps.G(P.fc1), true, d, I.grad_beta(P.fc1), side);
    gm.run(false, false, T, d, 2 * S, w.shared_dgu, 2 * S, ps.W(P.fc1), d, w.shared_out, false, d, 0, side);
  }
  if (I.shard.expert) {
    enqueue_expert_parallel_backward(I, A, l);  // d xs into ys, the routing weights' gradients into dw
    mark("moe expert-parallel experts bwd");
  } else {
    const ExpertRows r = local_rows(I, M);
    moe_expand(sh.dres16_full, M.where, T, k, d, w.dys, st);
    mark("moe permute bwd");
    run_expert_gemm(I, P, r, kMoeFc2Data);
    mark("moe grouped fc2 bwd data");
    run_expert_gemm(I, P, r, kMoeFc2Weight);
    mark("moe grouped fc2 bwd weight");
    moe_swiglu_backward(w.dact, M.gu, M.w, M.order, rows, F, w.dgu, w.dw, st);
    mark("moe swiglu bwd");
    run_expert_gemm(I, P, r, kMoeFc1Weight);
    mark("moe grouped fc1 bwd weight");
    run_expert_gemm(I, P, r, kMoeFc1Data);
    mark("moe grouped fc1 bwd data");
  }
  if (S > 0) I.moe_side->join(st);
  moe_combine(w.ys, M.where, T, k, d, S > 0 ? w.shared_out : nullptr, sh.dh, st);
  mark("moe combine bwd (+ the shared expert's data gradient)");
  // The router losses' gradients, weighted as the CPU model weights them (Model::backward's router_loss_weight).
  const auto& c = I.cfg;
  const double lw = in.router_loss_weight, n = static_cast<double>(T);
  const auto aux = static_cast<float>(lw * c.moe_aux_loss_coeff * E / (static_cast<double>(k) * n * n));
  const auto z = static_cast<float>(lw * c.moe_z_loss_coeff * 2.0 / n);
  moe_router_backward(router_shape(I, T), M.logits, M.idx, M.w, w.dw, M.offsets, M.kept, s.capacity(T), aux, z,
                      w.dlogits, st);
  I.gemm->run(true, false, E, d, T, w.dlogits, E, A.h2, d, I.params.G(P.router), true, d, I.grad_beta(P.router), st);
  I.gemm->run(false, false, T, d, E, w.dlogits, E, I.params.W(P.router), d, sh.dh, false, d, 1.0f, st);
  mark("moe router bwd");
}

std::vector<std::vector<std::int64_t>> CudaModel::moe_tokens_per_expert() const {
  const auto& I = *impl_;
  const auto& last = I.moe.last_offsets;
  std::vector<std::vector<std::int64_t>> out;
  std::vector<int> offsets(static_cast<std::size_t>(I.cfg.num_experts) + 1);
  for (std::size_t l = 0; l < I.lp.size(); ++l) {
    if (I.lp[l].router < 0) continue;
    auto& counts = out.emplace_back();
    if (l >= last.size() || !last[l]) continue;
    check_cuda(cudaStreamSynchronize(I.stream), "expert counts");
    check_cuda(cudaMemcpy(offsets.data(), last[l], sizeof(int) * offsets.size(), cudaMemcpyDeviceToHost),
               "expert counts");
    const int capacity = l < I.moe.last_capacity.size() ? I.moe.last_capacity[l] : 0;
    for (std::size_t e = 0; e + 1 < offsets.size(); ++e) {
      const int count = offsets[e + 1] - offsets[e];
      counts.push_back(capacity > 0 ? std::min(count, capacity) : count);  // the kept slots
    }
  }
  return out;
}

}  // namespace dlm::train
