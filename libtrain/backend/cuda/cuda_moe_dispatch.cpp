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
  const std::int64_t R = capacity_, d = shape.hidden, F = shape.ffn, E = shape.experts;
  rows_a = arena_.alloc<bf16>(R * d), rows_b = arena_.alloc<bf16>(R * d);
  dact = arena_.alloc<bf16>(R * F), dgu = arena_.alloc<bf16>(R * 2 * F);
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
  const std::int64_t R = capacity_, F = shape_.ffn;
  const int local = shape_.experts / ranks_;
  const std::int64_t ints = 2 * R + local + 1;
  m->perm = arena_.alloc<int>(ints), m->inv = m->perm + R, m->offsets = m->perm + 2 * R;
  m->x = arena_.alloc<bf16>(R * shape_.hidden), m->gu = arena_.alloc<bf16>(R * 2 * F), m->act = arena_.alloc<bf16>(R * F);
  m->w = arena_.alloc<float>(R);
  const auto per_gemm = static_cast<std::int64_t>(grouped_args_bytes(local));
  char* gemms = arena_.alloc<char>(kMoeGemms * per_gemm);
  for (int g = 0; g < kMoeGemms; ++g) m->gemms[g] = grouped_args_at(gemms + g * per_gemm, local);
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

// The received rows, permuted to local-expert order, over this rank's experts (R's offsets, from the plan).
ExpertRows dispatched_rows(Impl& I, DispatchedRows& R) {
  ExpertDispatch& X = I.dispatch;
  const int local = I.moe.shape().experts / I.shard.expert->size();
  return {R.offsets, local, R.x, R.gu, R.act, X.rows_b, X.rows_b, X.dact, X.dgu, X.rows_b, R.gemms};
}

// The counts exchange (the layer's host wait), then the host's plan (expert_dispatch_plan.h) uploaded, and the local
// experts' grouped GEMMs planned from its offsets, once for the forward and the backward.
void plan_dispatch(Impl& I, MoeLayerActs& M, DispatchedRows& R, const LayerParams& P) {
  ExpertDispatch& X = I.dispatch;
  DeviceGroup& g = *I.shard.expert;
  const MoeShape& s = I.moe.shape();
  const int E = s.experts, ranks = g.size(), local = E / ranks;
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
  const auto count = static_cast<std::size_t>(E);
  R.plan = plan_expert_dispatch(std::span<const int>(mine, count), std::span<const int>(mine + E, count), ranks);
  const ExpertDispatchPlan& plan = R.plan;
  const auto upload = [&](int* to, const std::vector<int>& from) {
    if (!from.empty())
      check_cuda(cudaMemcpyAsync(to, from.data(), sizeof(int) * from.size(), cudaMemcpyHostToDevice, st),
                 "expert permutation");
  };
  upload(R.perm, plan.perm), upload(R.inv, plan.inv), upload(R.offsets, plan.offsets);
  plan_expert_gemms(I, P, dispatched_rows(I, R));
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
  plan_dispatch(I, M, R, P);
  const ExpertDispatchPlan& plan = R.plan;
  const ExpertRows local = dispatched_rows(I, R);
  const auto send = times(plan.send, d), recv = times(plan.recv, d);
  moe_expand(A.h2, M.where, tokens, k, d, M.xs, st);
  g.all_to_all_v(M.xs, send, X.rows_a, recv, DeviceElement::kBF16, st);
  gather_f32(M.w, M.order, rows, X.w_sorted, st);
  g.all_to_all_v(X.w_sorted, plan.send, R.w, plan.recv, DeviceElement::kF32, st);
  moe_gather(X.rows_a, R.perm, plan.received, 1, d, R.x, st);
  run_expert_gemm(I, P, local, kMoeFc1);
  moe_swiglu_forward(R.gu, R.w, R.perm, plan.received, F, R.act, st);  // R.w is in received order: w[perm[j]]
  run_expert_gemm(I, P, local, kMoeFc2);
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
  DispatchedRows& R = X.layer(&M);
  const ExpertDispatchPlan& plan = R.plan;
  const ExpertRows local = dispatched_rows(I, R);
  const auto send = times(plan.send, d), recv = times(plan.recv, d);
  moe_expand(I.acts.shared.dres16_full, M.where, static_cast<int>(I.acts.T), k, d, w.dys, st);
  g.all_to_all_v(w.dys, send, X.rows_a, recv, DeviceElement::kBF16, st);
  moe_gather(X.rows_a, R.perm, plan.received, 1, d, X.rows_b, st);
  run_expert_gemm(I, P, local, kMoeFc2Data);
  run_expert_gemm(I, P, local, kMoeFc2Weight);
  moe_swiglu_backward(X.dact, R.gu, R.w, R.perm, plan.received, F, X.dgu, X.dw, st);  // dw in received order
  run_expert_gemm(I, P, local, kMoeFc1Weight);
  run_expert_gemm(I, P, local, kMoeFc1Data);
  moe_gather(X.rows_b, R.inv, plan.received, 1, d, X.rows_a, st);
  g.all_to_all_v(X.rows_a, recv, w.ys, send, DeviceElement::kBF16, st);  // d xs, as the local experts leave it
  g.all_to_all_v(X.dw, plan.recv, X.w_sorted, plan.send, DeviceElement::kF32, st);
  scatter_f32(X.w_sorted, M.order, rows, w.dw, st);
}

}  // namespace dlm::train
