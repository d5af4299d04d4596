// CudaModel's MoE layers (moe_layer.h): their buffers, and the forward and backward of one layer's MLP.
#include <algorithm>

#include "cuda_model_impl.h"
#include "moe_kernels.h"

namespace dlm::train {

namespace cuda {

void* MoeBuffers::pinned(std::size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMallocHost(&p, bytes), "cudaMallocHost");
  pinned_.push_back(p);
  return p;
}

void MoeBuffers::allocate(const MoeShape& shape, std::int64_t tokens) {
  release();
  shape_ = shape, tokens_ = tokens;
  const std::int64_t E = shape.experts, rows = tokens * shape.topk, F = shape.ffn, d = shape.hidden;
  const std::int64_t act = std::max(rows * F, tokens * shape.shared);  // the experts' or the shared expert's
  MoeWork& w = work_;
  w.xs = arena_.alloc<bf16>(rows * d), w.ys = arena_.alloc<bf16>(rows * d), w.dys = arena_.alloc<bf16>(rows * d);
  w.dact = arena_.alloc<bf16>(act), w.dgu = arena_.alloc<bf16>(2 * act);
  w.dlogits = arena_.alloc<bf16>(tokens * E);
  w.part = arena_.alloc<bf16>(shape.weight_gradients_in_place ? 0 : E * 2 * F * d);
  w.dw = arena_.alloc<float>(rows);
  w.sort = arena_.alloc<int>(cuda::moe_sort_scratch_ints(rows, shape.experts));
  w.offsets_host = static_cast<int*>(pinned(sizeof(int) * static_cast<std::size_t>(E + 1)));
}

void MoeBuffers::release() {
  arena_.release();
  for (void* p : pinned_) cudaFreeHost(p);
  pinned_.clear();
  slots_.clear();
  last_counts.clear();
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
  const std::int64_t E = shape_.experts, k = shape_.topk, rows = tokens_ * k, F = shape_.ffn;
  m->logits = arena_.alloc<float>(tokens_ * E), m->w = arena_.alloc<float>(rows);
  m->idx = arena_.alloc<int>(rows), m->where = arena_.alloc<int>(rows), m->order = arena_.alloc<int>(rows);
  m->offsets = arena_.alloc<int>(E + 1);
  m->gu = arena_.alloc<bf16>(rows * 2 * F), m->act = arena_.alloc<bf16>(rows * F);
  if (const std::int64_t S = shape_.shared; S > 0)
    m->shared_gu = arena_.alloc<bf16>(tokens_ * 2 * S), m->shared_act = arena_.alloc<bf16>(tokens_ * S);
  const std::int64_t addresses = kMoeGemms * 3 * E;
  m->addresses = static_cast<const void**>(static_cast<void*>(arena_.alloc<void*>(addresses)));
  m->staged = static_cast<const void**>(pinned(sizeof(void*) * static_cast<std::size_t>(addresses)));
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

// The experts' row counts to the host (the one wait of a layer's forward), the groups (experts with rows), and
// every grouped GEMM's operand addresses for them, uploaded once for the forward and the backward.
void plan_groups(Impl& I, MoeLayerActs& M, int l, const cuda_detail::LayerParams& P) {
  MoeWork& w = I.moe.work();
  const MoeShape& s = I.moe.shape();
  const int E = s.experts, d = s.hidden, F = s.ffn;
  const cudaStream_t st = I.stream;
  check_cuda(cudaMemcpyAsync(w.offsets_host, M.offsets, sizeof(int) * static_cast<std::size_t>(E + 1),
                             cudaMemcpyDeviceToHost, st),
             "expert counts");
  check_cuda(cudaStreamSynchronize(st), "expert counts");
  M.experts.clear(), M.rows.clear(), M.first.clear();
  M.tokens_per_expert.assign(static_cast<std::size_t>(E), 0);
  for (int e = 0; e < E; ++e) {
    const int rows = w.offsets_host[e + 1] - w.offsets_host[e];
    M.tokens_per_expert[static_cast<std::size_t>(e)] = rows;
    if (rows == 0) continue;
    M.experts.push_back(e), M.rows.push_back(rows), M.first.push_back(w.offsets_host[e]);
  }
  auto& last = I.moe.last_counts;
  if (static_cast<int>(last.size()) <= l) last.resize(static_cast<std::size_t>(l) + 1);
  last[static_cast<std::size_t>(l)] = M.tokens_per_expert;
  const bf16 *w1 = I.params.W(P.experts_fc1), *w2 = I.params.W(P.experts_fc2);
  // The weight gradients go straight into the fp32 gradients where the grouped GEMM writes fp32, else into `part`.
  const bool in_place = I.grouped->fp32_output();
  float *g1 = I.params.G(P.experts_fc1), *g2 = I.params.G(P.experts_fc2);
  const auto at = [&](MoeGemm g, int operand, std::size_t i) -> const void*& {
    return M.staged[(static_cast<std::size_t>(g) * 3 + operand) * E + i];
  };
  for (std::size_t i = 0; i < M.experts.size(); ++i) {
    const std::int64_t e = M.experts[i], r = M.first[i];
    const bf16 *w1e = w1 + e * 2 * F * d, *w2e = w2 + e * d * F;
    at(kMoeFc1, 0, i) = w.xs + r * d, at(kMoeFc1, 1, i) = w1e, at(kMoeFc1, 2, i) = M.gu + r * 2 * F;
    at(kMoeFc2, 0, i) = M.act + r * F, at(kMoeFc2, 1, i) = w2e, at(kMoeFc2, 2, i) = w.ys + r * d;
    at(kMoeFc2Data, 0, i) = w.dys + r * d, at(kMoeFc2Data, 1, i) = w2e, at(kMoeFc2Data, 2, i) = w.dact + r * F;
    at(kMoeFc2Weight, 0, i) = w.dys + r * d, at(kMoeFc2Weight, 1, i) = M.act + r * F;
    at(kMoeFc2Weight, 2, i) = in_place ? static_cast<const void*>(g2 + e * d * F) : w.part + e * d * F;
    at(kMoeFc1Data, 0, i) = w.dgu + r * 2 * F, at(kMoeFc1Data, 1, i) = w1e, at(kMoeFc1Data, 2, i) = w.ys + r * d;
    at(kMoeFc1Weight, 0, i) = w.dgu + r * 2 * F, at(kMoeFc1Weight, 1, i) = w.xs + r * d;
    at(kMoeFc1Weight, 2, i) = in_place ? static_cast<const void*>(g1 + e * 2 * F * d) : w.part + e * 2 * F * d;
  }
  check_cuda(cudaMemcpyAsync(M.addresses, M.staged, sizeof(void*) * kMoeGemms * 3 * static_cast<std::size_t>(E),
                             cudaMemcpyHostToDevice, st),
             "expert addresses");
}

// One grouped GEMM of the layer: per group, rows = its row count in the dimension the tokens run along (k: a weight
// gradient, added into the fp32 gradient where the grouped GEMM writes fp32, else written in bf16 to `part`).
enum class TokensIn { kM, kK };
void grouped(Impl& I, const MoeLayerActs& M, MoeGemm g, bool trans_a, bool trans_b, int m, int n, int k, int lda,
             int ldb, int ldc, TokensIn tokens) {
  const int E = I.moe.shape().experts;
  GroupedGemm::Problem p;
  p.trans_a = trans_a, p.trans_b = trans_b, p.lda = lda, p.ldb = ldb, p.ldc = ldc;
  p.m.assign(M.rows.size(), m), p.n.assign(M.rows.size(), n), p.k.assign(M.rows.size(), k);
  (tokens == TokensIn::kM ? p.m : p.k) = M.rows;
  if (tokens == TokensIn::kK && I.grouped->fp32_output()) p.c_f32 = true, p.beta = 1.0f;
  p.a = M.gemm_operand(g, 0, E), p.b = M.gemm_operand(g, 1, E), p.c = M.gemm_operand(g, 2, E);
  I.grouped->run(p, I.stream);
}

}  // namespace

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
  I.gemm->run(false, true, tokens, E, d, A.h2, d, I.params.W(P.router), d, M.logits, true, E, 0, st);
  moe_router_forward(router_shape(I, tokens), M.logits, M.idx, M.w, st);
  mark("moe router fwd");
  moe_sort_by_expert(M.idx, rows, E, w.sort, M.offsets, M.where, M.order, st);
  if (I.shard.expert) {
    enqueue_expert_parallel_forward(I, A, l, tokens);  // dispatch, local experts, combine: outputs in ys (moe_dispatch.h)
    mark("moe expert-parallel experts fwd (host wait)");
  } else {
    plan_groups(I, M, l, P);
    moe_gather(A.h2, M.order, rows, k, d, w.xs, st);
    mark("moe permute (host wait)");
    grouped(I, M, kMoeFc1, false, true, 0, 2 * F, d, d, d, 2 * F, TokensIn::kM);
    mark("moe grouped fc1 fwd");
    moe_swiglu_forward(M.gu, M.w, M.order, rows, F, M.act, st);
    mark("moe swiglu fwd");
  }
  const int S = s.shared;
  if (S > 0) {
    I.gemm->run(false, true, tokens, 2 * S, d, A.h2, d, I.params.W(P.fc1), d, M.shared_gu, false, 2 * S, 0, st);
    swiglu_forward(M.shared_gu, M.shared_act, tokens, S, st);
    mark("moe shared fc1 + swiglu fwd");
  }
  if (recompute) return;
  if (!I.shard.expert) {
    grouped(I, M, kMoeFc2, false, true, 0, d, F, F, F, d, TokensIn::kM);
    mark("moe grouped fc2 fwd");
  }
  moe_combine(w.ys, M.where, tokens, k, d, I.acts.shared.tmp, st);
  mark("moe combine fwd");
  if (S > 0) {
    I.gemm->run(false, true, tokens, d, S, M.shared_act, S, I.params.W(P.fc2), S, I.acts.shared.tmp, false, d, 1.0f, st);
    mark("moe shared fc2 fwd");
  }
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
  if (I.shard.expert) {
    enqueue_expert_parallel_backward(I, A, l);  // d xs into ys, the routing weights' gradients into dw
    mark("moe expert-parallel experts bwd");
  } else {
  // xs was overwritten by the later layers' forwards: gathered again.
  moe_gather(A.h2, M.order, rows, k, d, w.xs, st);
  moe_gather(sh.dres16_full, M.order, rows, k, d, w.dys, st);
  mark("moe permute bwd");
  grouped(I, M, kMoeFc2Data, false, false, 0, F, d, d, F, F, TokensIn::kM);
  mark("moe grouped fc2 bwd data");
  const bool in_place = I.grouped->fp32_output();  // else the weight gradients come through `part`
  grouped(I, M, kMoeFc2Weight, true, false, d, F, 0, d, F, F, TokensIn::kK);
  mark("moe grouped fc2 bwd weight");
  if (!in_place) {
    moe_accumulate_experts(w.part, M.offsets, E, static_cast<std::int64_t>(d) * F, I.params.G(P.experts_fc2), st);
    mark("moe weight gradient add");
  }
  moe_swiglu_backward(w.dact, M.gu, M.w, M.order, rows, F, w.dgu, w.dw, st);
  mark("moe swiglu bwd");
  grouped(I, M, kMoeFc1Weight, true, false, 2 * F, d, 0, 2 * F, d, d, TokensIn::kK);
  mark("moe grouped fc1 bwd weight");
  if (!in_place) {
    moe_accumulate_experts(w.part, M.offsets, E, static_cast<std::int64_t>(2) * F * d, I.params.G(P.experts_fc1), st);
    mark("moe weight gradient add");
  }
  grouped(I, M, kMoeFc1Data, false, false, 0, d, 2 * F, 2 * F, d, d, TokensIn::kM);
  mark("moe grouped fc1 bwd data");
  }  // the local experts (unindented: the block is the one-GPU path's, unchanged)
  moe_combine(w.ys, M.where, T, k, d, sh.dh, st);
  mark("moe combine bwd");
  if (const int S = s.shared; S > 0) {
    auto& gm = *I.gemm;
    const ParameterStore& ps = I.params;
    gm.run(true, false, d, S, T, sh.dres16_full, d, M.shared_act, S, ps.G(P.fc2), true, S, I.grad_beta(P.fc2), st);
    gm.run(false, false, T, S, d, sh.dres16_full, d, ps.W(P.fc2), S, w.dact, false, S, 0, st);
    swiglu_backward(w.dact, M.shared_gu, w.dgu, T, S, st);
    gm.run(true, false, 2 * S, d, T, w.dgu, 2 * S, A.h2, d, ps.G(P.fc1), true, d, I.grad_beta(P.fc1), st);
    gm.run(false, false, T, d, 2 * S, w.dgu, 2 * S, ps.W(P.fc1), d, sh.dh, false, d, 1.0f, st);
    mark("moe shared expert bwd");
  }
  // The router losses' gradients, weighted as the CPU model weights them (Model::backward's router_loss_weight).
  const auto& c = I.cfg;
  const double lw = in.router_loss_weight, n = static_cast<double>(T);
  const auto aux = static_cast<float>(lw * c.moe_aux_loss_coeff * E / (static_cast<double>(k) * n * n));
  const auto z = static_cast<float>(lw * c.moe_z_loss_coeff * 2.0 / n);
  moe_router_backward(router_shape(I, T), M.logits, M.idx, M.w, w.dw, M.offsets, aux, z, w.dlogits, st);
  I.gemm->run(true, false, E, d, T, w.dlogits, E, A.h2, d, I.params.G(P.router), true, d, I.grad_beta(P.router), st);
  I.gemm->run(false, false, T, d, E, w.dlogits, E, I.params.W(P.router), d, sh.dh, false, d, 1.0f, st);
  mark("moe router bwd");
}

std::vector<std::vector<std::int64_t>> CudaModel::moe_tokens_per_expert() const {
  std::vector<std::vector<std::int64_t>> out;
  const auto& I = *impl_;
  for (std::size_t l = 0; l < I.lp.size(); ++l)
    if (I.lp[l].router >= 0)
      out.push_back(l < I.moe.last_counts.size() ? I.moe.last_counts[l] : std::vector<std::int64_t>{});
  return out;
}

}  // namespace dlm::train
