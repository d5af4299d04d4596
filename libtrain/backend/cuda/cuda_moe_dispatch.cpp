// CudaModel's MoE layers under expert parallelism (moe_dispatch.h): the dispatch's buffers, the counts exchange and
// the host's plan of a layer, and the dispatch, local experts and combine of its forward and backward.
#include <numeric>

#include "cuda_model_impl.h"
#include "moe_dispatch.h"
#include "moe_kernels.h"

namespace dlm::train {

namespace cuda {

void ExpertDispatch::reserve(const MoeShape& shape, std::int64_t tokens, int ranks) {
  if (tokens == tokens_ && ranks == ranks_) return;
  release();
  shape_ = shape, tokens_ = tokens, ranks_ = ranks;
  capacity_ = static_cast<std::int64_t>(ranks) * tokens * shape.topk;
  const std::int64_t R = capacity_, d = shape.hidden, F = shape.ffn, E = shape.experts, local = E / ranks;
  rows_a = arena_.alloc<bf16>(R * d), rows_b = arena_.alloc<bf16>(R * d);
  dact = arena_.alloc<bf16>(R * F), dgu = arena_.alloc<bf16>(R * 2 * F);
  part = arena_.alloc<bf16>(shape.weight_gradients_in_place ? 0 : local * 2 * F * d);
  dw = arena_.alloc<float>(R), w_sorted = arena_.alloc<float>(tokens * shape.topk);
  counts = arena_.alloc<int>(2 * E);
  counts_host.assign(static_cast<std::size_t>(2 * E), 0);
}

void ExpertDispatch::release() {
  arena_.release();
  layers_.clear();
  tokens_ = capacity_ = 0, ranks_ = 0;
}

DispatchedRows& ExpertDispatch::layer(const MoeLayerActs* key) {
  auto& m = layers_[key];
  if (m) return *m;
  m = std::make_unique<DispatchedRows>();
  const std::int64_t R = capacity_, local = shape_.experts / ranks_, F = shape_.ffn;
  const std::int64_t ints = 2 * R + local + 1, addresses = kMoeGemms * 3 * local;
  m->perm = arena_.alloc<int>(ints), m->inv = m->perm + R, m->offsets = m->perm + 2 * R;
  m->x = arena_.alloc<bf16>(R * shape_.hidden), m->gu = arena_.alloc<bf16>(R * 2 * F), m->act = arena_.alloc<bf16>(R * F);
  m->w = arena_.alloc<float>(R);
  m->addresses = static_cast<const void**>(static_cast<void*>(arena_.alloc<void*>(addresses)));
  m->staged_addresses.assign(static_cast<std::size_t>(addresses), nullptr);
  return *m;
}

}  // namespace cuda

namespace {

using Impl = CudaModel::Impl;

std::vector<std::int64_t> times(const std::vector<std::int64_t>& rows, std::int64_t width) {
  std::vector<std::int64_t> out(rows);
  for (auto& r : out) r *= width;
  return out;
}

// The grouped GEMMs of the local experts, as moe_layer.h's MoeGemm names them, each C = op(A) op(B) (+ C for a
// weight gradient added in place), in row-major terms with the tokens along m (data) or k (weight gradients).
struct LocalGemm {
  bool trans_a, trans_b, weight_gradient;
  int m, n, k, lda, ldb, ldc;  // 0 where the group's rows go
};
LocalGemm local_gemm(MoeGemm g, int d, int F) {
  switch (g) {
    case kMoeFc1: return {false, true, false, 0, 2 * F, d, d, d, 2 * F};
    case kMoeFc2: return {false, true, false, 0, d, F, F, F, d};
    case kMoeFc2Data: return {false, false, false, 0, F, d, d, F, F};
    case kMoeFc2Weight: return {true, false, true, d, F, 0, d, F, F};
    case kMoeFc1Weight: return {true, false, true, 2 * F, d, 0, 2 * F, d, d};
    default: return {false, false, false, 0, d, 2 * F, 2 * F, d, d};  // kMoeFc1Data
  }
}

void run_local(Impl& I, const DispatchedRows& R, MoeGemm g) {
  const MoeShape& s = I.moe.shape();
  const int local = s.experts / I.shard.expert->size();
  const LocalGemm spec = local_gemm(g, s.hidden, s.ffn);
  GroupedGemm::Problem p;
  p.trans_a = spec.trans_a, p.trans_b = spec.trans_b, p.lda = spec.lda, p.ldb = spec.ldb, p.ldc = spec.ldc;
  const std::size_t groups = R.plan.rows.size();
  p.m.assign(groups, spec.m), p.n.assign(groups, spec.n), p.k.assign(groups, spec.k);
  (spec.m == 0 ? p.m : p.k) = R.plan.rows;
  if (spec.weight_gradient && I.grouped->fp32_output()) p.c_f32 = true, p.beta = 1.0f;
  p.a = R.operand(g, 0, local), p.b = R.operand(g, 1, local), p.c = R.operand(g, 2, local);
  I.grouped->run(p, I.stream);
}

// The counts exchange (the layer's host wait), then the host's plan (expert_dispatch_plan.h) and the local groups'
// grouped-GEMM operands, uploaded once for the forward and the backward.
void plan_dispatch(Impl& I, MoeLayerActs& M, DispatchedRows& R, int l, const LayerParams& P) {
  ExpertDispatch& X = I.dispatch;
  DeviceGroup& g = *I.shard.expert;
  const MoeShape& s = I.moe.shape();
  const int E = s.experts, ranks = g.size(), local = E / ranks, d = s.hidden, F = s.ffn;
  const cudaStream_t st = I.stream;
  moe_expert_counts(M.offsets, E, X.counts, st);
  const std::vector<std::int64_t> per_rank(static_cast<std::size_t>(ranks), local);
  g.all_to_all_v(X.counts, per_rank, X.counts + E, per_rank, DeviceElement::kI32, st);
  g.complete();  // the host never waits on a stream holding a collective it has not seen complete
  check_cuda(cudaMemcpyAsync(X.counts_host.data(), X.counts, sizeof(int) * 2 * static_cast<std::size_t>(E),
                             cudaMemcpyDeviceToHost, st),
             "expert counts");
  check_cuda(cudaStreamSynchronize(st), "expert counts");
  const int* mine = X.counts_host.data();
  M.tokens_per_expert.assign(mine, mine + E);
  auto& last = I.moe.last_counts;
  if (static_cast<int>(last.size()) <= l) last.resize(static_cast<std::size_t>(l) + 1);
  last[static_cast<std::size_t>(l)] = M.tokens_per_expert;
  const auto count = static_cast<std::size_t>(E);
  R.plan = plan_expert_dispatch(std::span<const int>(mine, count), std::span<const int>(mine + E, count), ranks);
  const ExpertDispatchPlan& plan = R.plan;
  const auto upload = [&](int* to, const std::vector<int>& from) {
    if (!from.empty())
      check_cuda(cudaMemcpyAsync(to, from.data(), sizeof(int) * from.size(), cudaMemcpyHostToDevice, st),
                 "expert permutation");
  };
  upload(R.perm, plan.perm), upload(R.inv, plan.inv), upload(R.offsets, plan.offsets);

  // Operands per MoeGemm: A, B, C of each group (bases advanced by the group's first row, or its expert).
  const bool in_place = I.grouped->fp32_output();
  const bf16 *w1 = I.params.W(P.experts_fc1), *w2 = I.params.W(P.experts_fc2);
  float *g1 = I.params.G(P.experts_fc1), *g2 = I.params.G(P.experts_fc2);
  for (std::size_t i = 0; i < plan.experts.size(); ++i) {
    const std::int64_t e = plan.experts[i], r = plan.first[i], fc1 = e * 2 * F * d, fc2 = e * d * F;
    const void* dw1 = in_place ? static_cast<const void*>(g1 + fc1) : X.part + fc1;
    const void* dw2 = in_place ? static_cast<const void*>(g2 + fc2) : X.part + fc2;
    const void* operands[kMoeGemms][3] = {
        {R.x + r * d, w1 + fc1, R.gu + r * 2 * F},          // kMoeFc1
        {R.act + r * F, w2 + fc2, X.rows_b + r * d},        // kMoeFc2: y
        {X.rows_b + r * d, w2 + fc2, X.dact + r * F},       // kMoeFc2Data: dy -> dact
        {X.rows_b + r * d, R.act + r * F, dw2},             // kMoeFc2Weight
        {X.dgu + r * 2 * F, w1 + fc1, X.rows_b + r * d},    // kMoeFc1Data: dgu -> dx
        {X.dgu + r * 2 * F, R.x + r * d, dw1}};             // kMoeFc1Weight
    for (int gemm = 0; gemm < kMoeGemms; ++gemm)
      for (int o = 0; o < 3; ++o) R.staged_addresses[(gemm * 3 + o) * local + static_cast<int>(i)] = operands[gemm][o];
  }
  check_cuda(cudaMemcpyAsync(R.addresses, R.staged_addresses.data(), sizeof(void*) * R.staged_addresses.size(),
                             cudaMemcpyHostToDevice, st),
             "expert addresses");
}

// A weight gradient the grouped GEMM wrote in bf16 (not in place) added into the expert's fp32 gradient.
void add_weight_gradient(Impl& I, const DispatchedRows& R, int p, std::int64_t per_expert) {
  if (I.grouped->fp32_output()) return;
  const int local = I.moe.shape().experts / I.shard.expert->size();
  moe_accumulate_experts(I.dispatch.part, R.offsets, local, per_expert, I.params.G(p), I.stream);
}

}  // namespace

void enqueue_expert_parallel_forward(Impl& I, LayerActs& A, int l, int tokens) {
  const auto& P = I.lp[static_cast<std::size_t>(l)];
  MoeLayerActs& M = *A.moe;
  MoeWork& w = I.moe.work();
  const MoeShape& s = I.moe.shape();
  DeviceGroup& g = *I.shard.expert;
  const int k = s.topk, d = s.hidden, F = s.ffn, rows = tokens * k;
  const cudaStream_t st = I.stream;
  I.dispatch.reserve(s, tokens, g.size());
  ExpertDispatch& X = I.dispatch;
  DispatchedRows& R = X.layer(&M);
  plan_dispatch(I, M, R, l, P);
  const ExpertDispatchPlan& plan = R.plan;
  const auto send = times(plan.send, d), recv = times(plan.recv, d);
  moe_gather(A.h2, M.order, rows, k, d, w.xs, st);
  g.all_to_all_v(w.xs, send, X.rows_a, recv, DeviceElement::kBF16, st);
  gather_f32(M.w, M.order, rows, X.w_sorted, st);
  g.all_to_all_v(X.w_sorted, plan.send, R.w, plan.recv, DeviceElement::kF32, st);
  moe_gather(X.rows_a, R.perm, plan.received, 1, d, R.x, st);
  run_local(I, R, kMoeFc1);
  moe_swiglu_forward(R.gu, R.w, R.perm, plan.received, F, R.act, st);  // R.w is in received order: w[perm[j]]
  run_local(I, R, kMoeFc2);
  moe_gather(X.rows_b, R.inv, plan.received, 1, d, X.rows_a, st);
  g.all_to_all_v(X.rows_a, recv, w.ys, send, DeviceElement::kBF16, st);
}

void enqueue_expert_parallel_backward(Impl& I, LayerActs& A, int l) {
  const auto& P = I.lp[static_cast<std::size_t>(l)];
  MoeLayerActs& M = *A.moe;
  MoeWork& w = I.moe.work();
  const MoeShape& s = I.moe.shape();
  DeviceGroup& g = *I.shard.expert;
  const int k = s.topk, d = s.hidden, F = s.ffn, rows = static_cast<int>(I.acts.T) * k;
  const cudaStream_t st = I.stream;
  ExpertDispatch& X = I.dispatch;
  const DispatchedRows& R = X.layer(&M);
  const ExpertDispatchPlan& plan = R.plan;
  const auto send = times(plan.send, d), recv = times(plan.recv, d);
  moe_gather(I.acts.shared.dres16_full, M.order, rows, k, d, w.dys, st);
  g.all_to_all_v(w.dys, send, X.rows_a, recv, DeviceElement::kBF16, st);
  moe_gather(X.rows_a, R.perm, plan.received, 1, d, X.rows_b, st);
  run_local(I, R, kMoeFc2Data);
  run_local(I, R, kMoeFc2Weight);
  add_weight_gradient(I, R, P.experts_fc2, static_cast<std::int64_t>(d) * F);
  moe_swiglu_backward(X.dact, R.gu, R.w, R.perm, plan.received, F, X.dgu, X.dw, st);  // dw in received order
  run_local(I, R, kMoeFc1Weight);
  add_weight_gradient(I, R, P.experts_fc1, static_cast<std::int64_t>(2) * F * d);
  run_local(I, R, kMoeFc1Data);
  moe_gather(X.rows_b, R.inv, plan.received, 1, d, X.rows_a, st);
  g.all_to_all_v(X.rows_a, recv, w.ys, send, DeviceElement::kBF16, st);  // d xs, as the local experts leave it
  g.all_to_all_v(X.dw, plan.recv, X.w_sorted, plan.send, DeviceElement::kF32, st);
  scatter_f32(X.w_sorted, M.order, rows, w.dw, st);
}

}  // namespace dlm::train
