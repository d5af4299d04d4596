// A training step of CudaModel as pipeline-stage calls, with the tensor-parallel collectives where
// Megatron puts them (cuda_model.h). Everything is enqueued on the model's stream; the only host waits are
// take_loss() and the uploads, which run before a step's first collective, and under expert parallelism one in each
// MoE layer's forward (moe_dispatch.h: the counts exchange), which waits for the work enqueued before it.
//
// Per layer, with Ts of the T token rows on this rank (Ts = T / TP under SP, else T):
//   h1 = gather(RMSNorm(res1))            [Ts, d] -> [T, d]   (SP: all-gather; else nothing)
//   qkv = h1 Wqkv_r^T ; attention over the rank's heads ; y = att Wproj_r^T   (partial sum over ranks)
//   tmp = scatter_sum(y)                  [T, d] -> [Ts, d]   (SP: reduce-scatter; else all-reduce)
//   and the same around the MLP. Backward mirrors it: the gradient entering a row-parallel GEMM is gathered,
//   the one leaving a column-parallel GEMM summed back. The head: hf gathered, logits over the rank's
//   vocabulary rows, the vocabulary-parallel cross-entropy (lse gathered, the label's logit summed).
// Activations kept per layer: see LayerActs. The residual gradient is carried in bf16 on the rank's rows (dres16),
// and leaves the stage in fp32 (dres).
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "cuda_model_impl.h"
#include "dlm/common/error.h"

namespace dlm::train {

namespace {

using Impl = CudaModel::Impl;

AttentionShape attention_shape(const Impl& I, bool causal) {
  return {static_cast<int>(I.acts.B), static_cast<int>(I.acts.S), I.heads, I.groups, I.cfg.kv_channels, causal};
}
// v is copied to the attention layout only for an attention that cannot read it from the projection.
QkvShape qkv_shape(const Impl& I, const AttentionShape& as) {
  return {static_cast<int>(I.acts.T), I.heads, I.groups, I.cfg.kv_channels, I.cfg.qk_layernorm,
          static_cast<float>(I.cfg.norm_epsilon), !I.attention->reads_v_from_projection(as)};
}
const float* opt(const Impl& I, int p) { return p >= 0 ? I.params.F(p) : nullptr; }
float* opt_grad(const Impl& I, int p) { return p >= 0 ? I.params.G(p) : nullptr; }

// Layer l's forward into A. With `previous` (the residual stream the previous layer leaves, its fc2 output in
// w.tmp) the input is their sum, written to A.res1; without it A.res1 holds the input already (the first
// layer, or a recomputation). `recompute`: the backward's rerun under full recomputation, which stops after SwiGLU
// (fc2's output only feeds the next layer) and is charged to one "recompute" phase. It writes what the first
// run wrote, bit for bit: the residual sum was rounded to bf16 before the first run normalised it.
// `kv` (the samplers' block KV cache): a storing forward also copies the layer's K and V into the store; a window
// forward runs the window's rows only (the whole model: Ts = T) and attends over the store (window_attention).
// `f8` (null: bf16): the linear layers in FP8 where its use() says so (fp8_linear.h; training's or the samplers'
// forward-only ones), the input casts fused into the norms and SwiGLU where those write the GEMM's whole input (no
// SP gather between).
void enqueue_layer_forward(Impl& I, const MicroInputs& in, LayerActs& A, int l, const bf16* previous, bool recompute,
                           Fp8Linears* f8, const KvPass* kv = nullptr) {
  SharedActs& w = I.acts.shared;  // the work buffers
  const ParameterStore& ps = I.params;
  const cudaStream_t st = I.stream;
  const bool window = kv && kv->window();
  const int T = static_cast<int>(window ? kv->rows() : I.acts.T), Ts = window ? T : static_cast<int>(I.acts.Ts),
            d = I.d(), F = I.ffn(), qd = I.qdim(), qkv = I.qkvdim();
  const auto eps = static_cast<float>(I.cfg.norm_epsilon);
  const AttentionShape as = attention_shape(I, in.causal);
  // window_attention reads V from the projection (and asks no engine about the shape).
  const QkvShape qs = window ? QkvShape{T, I.heads, I.groups, I.cfg.kv_channels, I.cfg.qk_layernorm, eps, false}
                             : qkv_shape(I, as);
  auto& gm = *I.gemm;
  auto mark = [&](const char* phase) {
    if (!recompute) I.timer.mark(phase, st);
  };
  const auto& P = I.lp[static_cast<std::size_t>(l)];
  const bool f8_attention = f8 && f8->use(l, T);
  Fp8Out h1_cast{};
  if (f8_attention && !I.sp) h1_cast = f8->producer_out(l, Fp8Linears::kQkv, st);
  bf16* h1 = I.sp ? w.hloc : A.h1;
  if (previous) rmsnorm_forward(previous, w.tmp, A.res1, ps.F(P.ln1), h1, A.rstd1, Ts, d, eps, st, h1_cast.slot ? &h1_cast : nullptr);
  else rmsnorm_forward(A.res1, nullptr, nullptr, ps.F(P.ln1), h1, A.rstd1, Ts, d, eps, st, h1_cast.slot ? &h1_cast : nullptr);
  I.gather(h1, A.h1);
  mark("rmsnorm fwd");
  if (f8_attention) {
    f8->cast_input(l, Fp8Linears::kQkv, A.h1, T, h1_cast.slot != nullptr, st);
    mark("fp8 casts fwd");
    f8->forward(gm, l, Fp8Linears::kQkv, T, A.qkv_raw, st);
  } else {
    gm.run(false, true, T, qkv, d, A.h1, d, ps.W(P.qkv), d, A.qkv_raw, false, qkv, 0, st);
  }
  mark("gemm qkv fwd");
  qk_norm_rope_forward(qs, A.qkv_raw, A.qkv_rot, A.qk_rstd, opt(I, P.qn), opt(I, P.kn), in.pos, I.rope_cos,
                       I.rope_sin, st);
  mark("qk-norm+rope fwd");
  // FP8: the window attention takes the projection's input amax as it writes its output, or casts it there with
  // the store's scales (Fp8Linears::begin_forward_only).
  Fp8Out att_cast{};
  if (window && f8_attention) att_cast = f8->producer_out(l, Fp8Linears::kProj, st);
  if (window) {
    const KvStore& kvs = *kv->store;
    const WindowAttentionShape ws{static_cast<int>(kvs.batch), static_cast<int>(kvs.seq), I.heads, I.groups,
                                  I.cfg.kv_channels, kv->width};
    // Cast with the store's scales, the projection reads the FP8 output alone: no bf16 copy is written.
    window_attention(ws, kvs.first, A.qkv_rot, A.qkv_raw, kvs.k[static_cast<std::size_t>(l)],
                     kvs.v[static_cast<std::size_t>(l)], att_cast.out ? nullptr : A.att, st, 0, 0,
                     att_cast.slot ? &att_cast : nullptr);
    mark("window attention fwd");
  } else {
    I.attention->forward(as, A.qkv_rot, A.qkv_raw, A.att, A.lse, st);
    mark("attention fwd");
    if (kv) {
      kv_store(A.qkv_rot, A.qkv_raw, T, I.heads, I.groups, I.cfg.kv_channels, kv->store->k[static_cast<std::size_t>(l)],
               kv->store->v[static_cast<std::size_t>(l)], st);
      mark("kv store");
    }
  }
  if (f8_attention) {
    f8->cast_input(l, Fp8Linears::kProj, A.att, T, att_cast.slot != nullptr, st);
    mark("fp8 casts fwd");
    f8->forward(gm, l, Fp8Linears::kProj, T, w.tmp_full, st);
  } else {
    gm.run(false, true, T, d, qd, A.att, qd, ps.W(P.proj), qd, w.tmp_full, false, d, 0, st);
  }
  I.scatter_sum(w.tmp_full, w.tmp);
  mark("gemm proj fwd");
  // The last layer's MLP on the loss rows (Impl::loss_rows_mlp): its residual input and attention output packed
  // into dres16 and dh, which hold nothing outside a backward, or for the backward's rerun into dgu, which holds
  // nothing before the layer's fc2 backward (dres16 holds the head's gradient then); its activations are the first
  // `rows` rows.
  const int packed = l == I.layers - 1 ? I.loss_rows_mlp(in) : 0;
  const int rows = packed ? packed : T;
  const Gemm::RowFamily by_m{Gemm::RowFamily::kM, T};
  const Gemm::RowFamily* family = packed ? &by_m : nullptr;
  const bf16 *residual = A.res1, *block_out = w.tmp;
  if (packed) {
    bf16* into_residual = recompute ? w.dgu : w.dres16;
    bf16* into_block_out = recompute ? w.dgu + static_cast<std::int64_t>(T) * d : w.dh;
    gather_rows(A.res1, in.head_rows, packed, d, into_residual, st);
    gather_rows(w.tmp, in.head_rows, packed, d, into_block_out, st);
    residual = into_residual, block_out = into_block_out;
  }
  const bool f8_mlp = f8 && !P.moe() && f8->use(l, rows);
  Fp8Out h2_cast{};
  if (f8_mlp && !I.sp) h2_cast = f8->producer_out(l, Fp8Linears::kFc1, st);
  bf16* h2 = I.sp ? w.hloc : A.h2;
  rmsnorm_forward(residual, block_out, A.res2, ps.F(P.ln2), h2, A.rstd2, packed ? packed : Ts, d, eps, st,
                  h2_cast.slot ? &h2_cast : nullptr);
  I.gather(h2, A.h2);
  mark("rmsnorm fwd");
  if (P.moe()) {  // no tensor parallelism, no packed rows: rows == T; marks its own phases
    enqueue_moe_forward(I, A, l, T, recompute);
    if (recompute) I.timer.mark("recompute", st);
    return;
  }
  if (f8_mlp) {
    f8->cast_input(l, Fp8Linears::kFc1, A.h2, rows, h2_cast.slot != nullptr, st);
    mark("fp8 casts fwd");
    f8->forward(gm, l, Fp8Linears::kFc1, rows, A.gu, st);
  } else {
    gm.run(false, true, rows, 2 * F, d, A.h2, d, ps.W(P.fc1), d, A.gu, false, 2 * F, 0, st, family);
  }
  mark("gemm fc1 fwd");
  // FP8: fc2's input cast from SwiGLU (training: straight into FP8, its transpose kept in A.act's bytes for fc2's
  // backward; Fp8Linears::swiglu_forward).
  if (f8_mlp) f8->swiglu_forward(l, A.gu, rows, F, A.act, st);
  else swiglu_forward(A.gu, A.act, rows, F, st);
  mark("swiglu fwd");
  if (recompute) return I.timer.mark("recompute", st);
  if (f8_mlp) {
    f8->forward(gm, l, Fp8Linears::kFc2, rows, w.tmp_full, st);
  } else {
    gm.run(false, true, rows, d, F, A.act, F, ps.W(P.fc2), F, w.tmp_full, false, d, 0, st, family);
  }
  I.scatter_sum(w.tmp_full, w.tmp);
  mark("gemm fc2 fwd");
}

}  // namespace

void enqueue_forward(Impl& I, const MicroInputs& in, std::vector<LayerActs>& la, const KvPass* kv, int fp8_slot) {
  SharedActs& w = I.acts.shared;  // the work buffers
  const ParameterStore& ps = I.params;
  const cudaStream_t st = I.stream;
  const bool window = kv && kv->window();
  const int T = static_cast<int>(window ? kv->rows() : I.acts.T), Ts = window ? T : static_cast<int>(I.acts.Ts),
            d = I.d();
  const auto eps = static_cast<float>(I.cfg.norm_epsilon);
  auto mark = [&](const char* phase) { I.timer.mark(phase, st); };
  I.timer.start(st);
  // Training's FP8 linears for a training stage's forward, the samplers' (forward-only) for a sampling forward.
  Fp8Linears* f8 = fp8_slot >= 0 ? I.fp8.get() : I.sampling_fp8.get();
  if (f8 && fp8_slot >= 0) {
    f8->begin_forward(I.params, I.acts.T, fp8_slot, st);
    mark("fp8 scales + weight casts");
  } else if (f8) {
    // A window casts with the scales of the storing forward that filled its store (fp8_linear.h).
    Fp8Slot* stored = window ? kv->store->fp8_input_scales : nullptr;
    if (window && !stored && f8->input_slot_count() > 0)
      fail("CudaModel: an FP8 window over a KV store without FP8 input scales");
    f8->begin_forward_only(T, st, stored);
  }
  if (I.pre) {
    // Each rank looks up its rows of the table (zeros for the others'); the sum over the group is the
    // embedding, under SP straight into the rank's token rows.
    bf16* x = la[0].res1;
    I.catch_up_rows(in.ids, T);  // the rows AdamW deferred that these tokens read (set_sparse_embedding_grad)
    embedding_forward(in.ids, ps.W(I.emb), I.sp ? w.tmp_full : x, T, d, st);
    I.scatter_sum(I.sp ? w.tmp_full : x, x);
    mark("embedding fwd");
  }
  for (int l = 0; l < I.layers; ++l)
    enqueue_layer_forward(I, in, la[static_cast<std::size_t>(l)], l, l == 0 ? nullptr : la[l - 1].res2, false, f8, kv);
  if (f8 && fp8_slot < 0 && kv && !window) f8->keep_input_scales(kv->store->fp8_input_scales, st);
  const bf16* last = la.back().res2;
  if (I.post) {
    // With the last MLP on the loss rows, hf holds those rows, packed.
    const int packed = I.loss_rows_mlp(in), rows = packed ? packed : Ts;
    // The samplers' FP8 output layer: its input cast by the norm (as the layers' inputs are).
    Fp8Out hf_cast{};
    if (f8 && fp8_slot < 0 && f8->has_head() && !I.sp) hf_cast = f8->head_producer_out();
    rmsnorm_forward(last, w.tmp, w.res_f, ps.F(I.lnf), I.sp ? w.hloc : w.hf, w.rstd_f, rows, d, eps, st,
                    hf_cast.slot ? &hf_cast : nullptr);
    I.gather(w.hloc, w.hf);
    if (hf_cast.slot) f8->cast_head_input(w.hf, rows, true, st);
    mark("rmsnorm fwd");
  } else {
    add_bf16(last, w.tmp, w.stage_out, static_cast<std::int64_t>(Ts) * d, st);
  }
  check_cuda(cudaGetLastError(), "forward");
}

namespace {

// The slot into which the kernel writing the whole output gradient of layer l's linear g (`rows` rows) maxes its
// amax (tensorwise FP8: Fp8Linears::grad_amax), or null. A residual gradient's producer (RMSNorm backward) writes
// only the rank's rows under SP (gathered after it), so it takes none there.
Fp8Slot* grad_amax(Impl& I, int l, Fp8Linears::Linear g, int rows, bool residual) {
  if (!I.fp8 || l < 0 || (residual && I.sp) || I.lp[static_cast<std::size_t>(l)].moe()) return nullptr;
  return I.fp8->grad_amax(l, g, rows);
}

// Output layer and loss on the rows with loss weight (in.head_count of them, packed from hf into head_x unless
// that is every row), a chunk of rows at a time: logits, the CE gradient in place, then (backward) the weight
// gradient and the rows' gradient, which overwrites the chunk's packed rows (the weight GEMM has read them);
// scattered back into dh_full, zeros on the rows without loss; then the final norm's backward, leaving
// d residual (bf16) in dres16. The rows without loss weight have a zero gradient either way: skipping them
// changes nothing but the time (about half the head's GEMMs under the diffusion objective).
void enqueue_head(Impl& I, const MicroInputs& in, bool backward) {
  SharedActs& w = I.acts.shared;  // the work buffers
  const ParameterStore& ps = I.params;
  const cudaStream_t st = I.stream;
  const int d = I.d(), V = I.vpad();
  auto& gm = *I.gemm;
  const std::int64_t count = in.head_count;
  const bf16* x = w.hf;
  bf16* dx = w.dh_full;
  const bool packed_mlp = I.loss_rows_mlp(in) > 0;  // hf is packed already
  if (in.head_packed) {
    if (packed_mlp)
      check_cuda(cudaMemcpyAsync(w.head_x, w.hf, static_cast<std::size_t>(count) * d * sizeof(bf16),
                                 cudaMemcpyDeviceToDevice, st),
                 "head rows");
    else
      gather_rows(w.hf, in.head_rows, static_cast<int>(count), d, w.head_x, st);
    x = dx = w.head_x;
  }
  // Packed row counts change every micro-batch: one algorithm per GEMM of the head, chosen at the chunk's rows.
  const int most = static_cast<int>(I.acts.chunk);
  const Gemm::RowFamily in_m{Gemm::RowFamily::kM, most}, in_k{Gemm::RowFamily::kK, most};
  const bool family = in.head_packed;
  const Gemm::RowFamily *fam_m = family ? &in_m : nullptr, *fam_k = family ? &in_k : nullptr;
  for (std::int64_t c0 = 0; c0 < count; c0 += I.acts.chunk) {
    const int rows = static_cast<int>(std::min<std::int64_t>(I.acts.chunk, count - c0));
    gm.run(false, true, rows, V, d, x + c0 * d, d, ps.W(I.out), d, w.logits, false, V, 0, st, fam_m);
    I.timer.mark("gemm logits fwd", st);
    if (I.tp == 1) {
      cross_entropy_forward_backward(w.logits, V, in.labels + c0, in.weights + c0, in.loss_rows + c0, rows,
                                     static_cast<int>(I.cfg.vocab_size), st);
    } else {
      const int first = static_cast<int>(I.vocab_first), real = static_cast<int>(I.vocab_local);
      float* mine = w.ce_lse + static_cast<std::int64_t>(I.shard.tensor->rank()) * rows;
      vocab_parallel_ce_local(w.logits, V, in.labels + c0, in.weights + c0, first, real, mine, w.ce_label, rows, st);
      I.shard.tensor->all_gather(mine, w.ce_lse, static_cast<std::size_t>(rows), DeviceElement::kF32, st);
      I.shard.tensor->all_reduce(w.ce_label, static_cast<std::size_t>(rows), DeviceElement::kF32, st);
      vocab_parallel_ce_backward(w.logits, V, in.labels + c0, in.weights + c0, first, real, w.ce_lse, I.tp, w.ce_label,
                                 in.loss_rows + c0, rows, st);
    }
    I.timer.mark("cross-entropy", st);
    if (!backward) continue;
    gm.run(true, false, V, d, rows, w.logits, V, x + c0 * d, d, ps.G(I.out), true, d, I.grad_beta(I.out), st, fam_k);
    gm.run(false, false, rows, d, V, w.logits, V, ps.W(I.out), d, dx + c0 * d, false, d, 0, st, fam_m);
    I.timer.mark("gemm logits bwd", st);
  }
  accumulate_sum(in.loss_rows, count, w.loss_total, st);
  if (!backward) return;
  I.settle_grad(I.out);  // when no row had loss weight, the output layer's gradient (still fresh) is zero
  if (packed_mlp) {
    // The last MLP's rows stay packed: d residual of the loss rows into dres16's first rows.
    rmsnorm_backward(w.head_x, w.res_f, ps.F(I.lnf), w.rstd_f, w.dres16, false, ps.G(I.lnf), w.partial,
                     static_cast<int>(count), d, st, grad_amax(I, I.layers - 1, Fp8Linears::kFc2, static_cast<int>(count), true));
    I.timer.mark("rmsnorm bwd", st);
    return;
  }
  if (in.head_packed) scatter_rows(w.head_x, in.head_slot, static_cast<int>(I.acts.T), d, w.dh_full, st);
  I.scatter_sum(w.dh_full, w.dh);
  rmsnorm_backward(w.dh, w.res_f, ps.F(I.lnf), w.rstd_f, w.dres16, false, ps.G(I.lnf), w.partial,
                   static_cast<int>(I.acts.Ts), d, st,
                   grad_amax(I, I.layers - 1, Fp8Linears::kFc2, static_cast<int>(I.acts.T), true));
  I.timer.mark("rmsnorm bwd", st);
}

void enqueue_backward_layers(Impl& I, const MicroInputs& in, std::vector<LayerActs>& la) {
  SharedActs& w = I.acts.shared;  // the work buffers
  const ParameterStore& ps = I.params;
  const cudaStream_t st = I.stream;
  const int T = static_cast<int>(I.acts.T), Ts = static_cast<int>(I.acts.Ts), d = I.d(), F = I.ffn(), qd = I.qdim(),
            qkv = I.qkvdim();
  const AttentionShape as = attention_shape(I, in.causal);
  const QkvShape qs = qkv_shape(I, as);
  auto& gm = *I.gemm;
  Fp8Linears* f8 = I.fp8.get();
  auto mark = [&](const char* phase) { I.timer.mark(phase, st); };
  for (int l = I.layers - 1; l >= 0; --l) {
    const auto& P = I.lp[static_cast<std::size_t>(l)];
    auto& A = la[static_cast<std::size_t>(l)];
    if (I.acts.recompute) enqueue_layer_forward(I, in, A, l, nullptr, true, f8);
    // The last layer's MLP on the loss rows (as its forward ran): `rows` packed rows, then back to every row.
    const int packed = l == I.layers - 1 ? I.loss_rows_mlp(in) : 0;
    const int rows = packed ? packed : T;
    const Gemm::RowFamily by_m{Gemm::RowFamily::kM, T}, by_k{Gemm::RowFamily::kK, T};
    const Gemm::RowFamily *fam_m = packed ? &by_m : nullptr, *fam_k = packed ? &by_k : nullptr;
    I.gather(w.dres16, w.dres16_full);
    const bool f8_mlp = f8 && !P.moe() && f8->use(l, rows), f8_attention = f8 && f8->use(l, T);
    if (P.moe()) {
      enqueue_moe_backward(I, in, A, l);  // marks its own phases
    } else if (f8_mlp) {
      f8->cast_backward(l, Fp8Linears::kFc2, rows, w.dres16_full, A.act, st);
      mark("fp8 casts bwd");
      f8->backward_weight(gm, l, Fp8Linears::kFc2, rows, ps.G(P.fc2), I.grad_beta(P.fc2), st);
      mark("gemm fc2 bwd weight");
      f8->backward_data(gm, l, Fp8Linears::kFc2, rows, w.dact, st);
      mark("gemm fc2 bwd data");
      // fc1's gradient straight into FP8, both layouts (no bf16 dgu).
      f8->swiglu_backward(l, w.dact, A.gu, rows, F, st);
      mark("swiglu bwd");
      f8->cast_backward(l, Fp8Linears::kFc1, rows, nullptr, A.h2, st);
      mark("fp8 casts bwd");
      f8->backward_weight(gm, l, Fp8Linears::kFc1, rows, ps.G(P.fc1), I.grad_beta(P.fc1), st);
      mark("gemm fc1 bwd weight");
      f8->backward_data(gm, l, Fp8Linears::kFc1, rows, w.dh_full, st);
      I.scatter_sum(w.dh_full, w.dh);
      mark("gemm fc1 bwd data");
    } else {
      gm.run(true, false, d, F, rows, w.dres16_full, d, A.act, F, ps.G(P.fc2), true, F, I.grad_beta(P.fc2), st, fam_k);
      mark("gemm fc2 bwd weight");
      if (I.swiglu_gemm->run(w.dres16_full, ps.W(P.fc2), A.gu, w.dgu, rows, d, F, st)) {
        mark("gemm fc2 bwd data + swiglu bwd");
      } else {
        gm.run(false, false, rows, F, d, w.dres16_full, d, ps.W(P.fc2), F, w.dact, false, F, 0, st, fam_m);
        mark("gemm fc2 bwd data");
        swiglu_backward(w.dact, A.gu, w.dgu, rows, F, st);
        mark("swiglu bwd");
      }
      gm.run(true, false, 2 * F, d, rows, w.dgu, 2 * F, A.h2, d, ps.G(P.fc1), true, d, I.grad_beta(P.fc1), st, fam_k);
      mark("gemm fc1 bwd weight");
      gm.run(false, false, rows, d, 2 * F, w.dgu, 2 * F, ps.W(P.fc1), d, w.dh_full, false, d, 0, st, fam_m);
      I.scatter_sum(w.dh_full, w.dh);
      mark("gemm fc1 bwd data");
    }
    rmsnorm_backward(w.dh, A.res2, ps.F(P.ln2), A.rstd2, w.dres16, true, ps.G(P.ln2), w.partial, packed ? packed : Ts,
                     d, st, grad_amax(I, l, Fp8Linears::kProj, T, true));
    if (packed) {
      // d residual on every row: the loss rows' (slot order), zeros elsewhere, through dh into dres16.
      scatter_rows(w.dres16, in.head_slot, T, d, w.dh, st);
      check_cuda(cudaMemcpyAsync(w.dres16, w.dh, static_cast<std::size_t>(T) * d * sizeof(bf16),
                                 cudaMemcpyDeviceToDevice, st),
                 "residual gradient");
    }
    mark("rmsnorm bwd");
    I.gather(w.dres16, w.dres16_full);
    if (f8_attention) {
      f8->cast_backward(l, Fp8Linears::kProj, T, w.dres16_full, A.att, st);
      mark("fp8 casts bwd");
      f8->backward_weight(gm, l, Fp8Linears::kProj, T, ps.G(P.proj), I.grad_beta(P.proj), st);
      mark("gemm proj bwd weight");
      f8->backward_data(gm, l, Fp8Linears::kProj, T, w.datt, st);
    } else {
      gm.run(true, false, d, qd, T, w.dres16_full, d, A.att, qd, ps.G(P.proj), true, qd, I.grad_beta(P.proj), st);
      mark("gemm proj bwd weight");
      gm.run(false, false, T, qd, d, w.dres16_full, d, ps.W(P.proj), qd, w.datt, false, qd, 0, st);
    }
    mark("gemm proj bwd data");
    I.attention->backward(as, A.qkv_rot, A.qkv_raw, A.att, w.datt, A.lse, w.delta, w.dqkv_rot, w.dqkv, st);
    mark("attention bwd");
    qk_norm_rope_backward(qs, w.dqkv_rot, A.qkv_raw, A.qk_rstd, opt(I, P.qn), opt(I, P.kn), in.pos, I.rope_cos,
                          I.rope_sin, w.dqkv, opt_grad(I, P.qn), opt_grad(I, P.kn), w.partial, st);
    mark("qk-norm+rope bwd");
    if (f8_attention) {
      f8->cast_backward(l, Fp8Linears::kQkv, T, w.dqkv, A.h1, st);
      mark("fp8 casts bwd");
      f8->backward_weight(gm, l, Fp8Linears::kQkv, T, ps.G(P.qkv), I.grad_beta(P.qkv), st);
      mark("gemm qkv bwd weight");
      f8->backward_data(gm, l, Fp8Linears::kQkv, T, w.dh_full, st);
    } else {
      gm.run(true, false, qkv, d, T, w.dqkv, qkv, A.h1, d, ps.G(P.qkv), true, d, I.grad_beta(P.qkv), st);
      mark("gemm qkv bwd weight");
      gm.run(false, false, T, d, qkv, w.dqkv, qkv, ps.W(P.qkv), d, w.dh_full, false, d, 0, st);
    }
    I.scatter_sum(w.dh_full, w.dh);
    mark("gemm qkv bwd data");
    rmsnorm_backward(w.dh, A.res1, ps.F(P.ln1), A.rstd1, w.dres16, true, ps.G(P.ln1), w.partial, Ts, d, st,
                     grad_amax(I, l - 1, Fp8Linears::kFc2, T, true));
    mark("rmsnorm bwd");
    if (I.layer_hook) I.layer_hook(I.first_layer + l);
  }
  // The residual gradient leaves the layers in fp32: the embedding's backward and a previous stage take it so.
  bf16_to_f32(w.dres16, w.dres, I.acts.Ts * d, st);
  if (I.pre) {
    // Every row's gradient reaches the rank's rows of the table (under SP gathered first).
    if (I.sp)
      I.shard.tensor->all_gather(w.dres, w.dres_full, static_cast<std::size_t>(I.acts.Ts * d), DeviceElement::kF32, st);
    embedding_backward(w.dres_full, in.order, in.segments, in.num_segments, in.combine, in.num_combine, w.emb_partial,
                       ps.G(I.emb), I.deferred.on ? I.deferred.written : nullptr, d, st);
    mark("embedding bwd");
  }
}

}  // namespace

void CudaModel::upload_inputs(int k, const CudaBatch& batch) {
  upload_micro_batch(*impl_, k, batch, Upload::kTraining);
}

void CudaModel::reserve_slots(int count) {
  if (count > 0) impl_->slot_acts(count - 1);
}
std::int64_t CudaModel::stage_rows() const { return impl_->acts.Ts; }
void* CudaModel::stage_input(int slot) { return impl_->slot_acts(slot)[0].res1; }
const void* CudaModel::stage_output() const { return impl_->acts.shared.stage_out; }
float* CudaModel::stage_output_grad() { return impl_->acts.shared.dres_in; }
const float* CudaModel::stage_input_grad() const { return impl_->acts.shared.dres; }

void CudaModel::forward_stage(int k, int slot, bool training) {
  auto& I = *impl_;
  const MicroInputs& in = I.inputs.uploaded(k);
  if (I.post) I.acts.use_head(slot);
  enqueue_forward(I, in, I.slot_acts(slot), nullptr, slot);
  if (!I.post) return;
  if (!training) enqueue_head(I, in, false);
}

void CudaModel::backward_stage(int k, int slot) {
  auto& I = *impl_;
  const MicroInputs& in = I.inputs.uploaded(k);
  if (I.fp8) I.fp8->begin_backward(slot, I.stream);  // before the head's norm, the first gradient producer
  if (I.post) {
    // The head's inputs are the slot's (its forward may not be the last one run).
    I.acts.use_head(slot);
    enqueue_head(I, in, true);
  } else {
    f32_to_bf16(I.acts.shared.dres_in, I.acts.shared.dres16, I.acts.Ts * I.d(), I.stream);
  }
  enqueue_backward_layers(I, in, I.slot_acts(slot));
  I.timer.finish();
  check_cuda(cudaGetLastError(), "backward");
}

double CudaModel::take_loss() {
  auto& I = *impl_;
  if (!I.acts.shared.loss_total) return 0;
  double loss = 0;
  check_cuda(cudaMemcpyAsync(&loss, I.acts.shared.loss_total, sizeof loss, cudaMemcpyDeviceToHost, I.stream), "loss");
  check_cuda(cudaMemsetAsync(I.acts.shared.loss_total, 0, sizeof(double), I.stream), "loss");
  synchronize();
  return loss;
}

double CudaModel::forward_backward(const CudaBatch& b) {
  upload_inputs(0, b);
  forward_stage(0, 0, true);
  backward_stage(0, 0);
  return take_loss();
}

double CudaModel::forward_loss(const CudaBatch& b) {
  upload_micro_batch(*impl_, 0, b, Upload::kLoss);
  forward_stage(0, 0, false);
  return take_loss();
}

}  // namespace dlm::train
