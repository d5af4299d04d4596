#include "activations.h"

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train::cuda {

static_assert(kEmbeddingSegment == kCudaEmbeddingSegment, "the embedding plan's segment is the layout's");

void ActivationBuffers::allocate(const CudaActivationLayout& l, std::int64_t batch, std::int64_t seq,
                                 std::int64_t partial_floats, cudaStream_t stream) {
  release();
  layout = l;
  B = batch, S = seq, T = l.tokens, Ts = l.rows, chunk = l.chunk;
  const CudaSharedActsLayout& n = l.shared;
  auto& a = arena;
  SharedActs& s = shared;
  s.tmp = a.alloc<bf16>(n.tmp), s.res_f = a.alloc<bf16>(n.res_f), s.dres16 = a.alloc<bf16>(n.dres16);
  s.dh = a.alloc<bf16>(n.dh), s.hf = a.alloc<bf16>(n.hf), s.logits = a.alloc<bf16>(n.logits);
  s.dact = a.alloc<bf16>(n.dact);
  s.tmp_full = n.tmp_full ? a.alloc<bf16>(n.tmp_full) : s.tmp, s.hloc = n.hloc ? a.alloc<bf16>(n.hloc) : nullptr;
  s.dres16_full = n.dres16_full ? a.alloc<bf16>(n.dres16_full) : s.dres16;
  s.dh_full = n.dh_full ? a.alloc<bf16>(n.dh_full) : s.dh;
  s.stage_out = n.stage_out ? a.alloc<bf16>(n.stage_out) : nullptr;
  s.dres_in = n.dres_in ? a.alloc<float>(n.dres_in) : nullptr;
  s.dgu = a.alloc<bf16>(n.dgu), s.datt = a.alloc<bf16>(n.datt), s.dqkv_rot = a.alloc<bf16>(n.dqkv_rot);
  s.dqkv = a.alloc<bf16>(n.dqkv);
  // head_x: only the last stage (one with a head) has one; dgu's memory unless the layout gives it its own.
  s.head_x = !l.head.hf ? nullptr : n.head_x ? a.alloc<bf16>(n.head_x) : s.dgu;
  s.rstd_f = a.alloc<float>(n.rstd_f), s.dres = a.alloc<float>(n.dres), s.delta = a.alloc<float>(n.delta);
  s.dres_full = n.dres_full ? a.alloc<float>(n.dres_full) : s.dres;
  if (n.ce_lse) s.ce_lse = a.alloc<float>(n.ce_lse), s.ce_label = a.alloc<float>(n.ce_label);
  s.partial = a.alloc<float>(partial_floats);
  s.emb_partial = a.alloc<float>(n.emb_partial);
  s.loss_total = a.alloc<double>(1);
  check_cuda(cudaMemsetAsync(s.loss_total, 0, sizeof(double), stream), "memset");
}

void ActivationBuffers::release() {
  arena.release();
  shared = SharedActs{};
  slots.clear();
  work = LayerActs{};
  head_acts.clear();
  B = S = T = Ts = chunk = 0;  // the next upload allocates for its shape
}

LayerActs ActivationBuffers::layer_acts(bool input) {
  const CudaLayerActsLayout& n = layout.layer;
  auto& a = arena;
  LayerActs l{};
  if (input) l.res1 = a.alloc<bf16>(n.res1);
  l.h1 = a.alloc<bf16>(n.h1), l.qkv_raw = a.alloc<bf16>(n.qkv_raw), l.qkv_rot = a.alloc<bf16>(n.qkv_rot);
  l.att = a.alloc<bf16>(n.att), l.res2 = a.alloc<bf16>(n.res2), l.h2 = a.alloc<bf16>(n.h2);
  l.gu = a.alloc<bf16>(n.gu), l.act = a.alloc<bf16>(n.act);
  l.rstd1 = a.alloc<float>(n.rstd1), l.qk_rstd = a.alloc<float>(n.qk_rstd), l.lse = a.alloc<float>(n.lse);
  l.rstd2 = a.alloc<float>(n.rstd2);
  return l;
}

std::vector<LayerActs>& ActivationBuffers::slot(int s, int layers) {
  if (s < 0) fail(fmt::format("CudaModel: activation slot {}", s));
  if (recompute && !work.h1) work = layer_acts(false);
  while (static_cast<int>(slots.size()) <= s) {
    auto& la = slots.emplace_back(static_cast<std::size_t>(layers));
    for (auto& l : la) {
      if (recompute) l = work, l.res1 = arena.alloc<bf16>(layout.layer.res1);
      else l = layer_acts(true);
    }
  }
  return slots[static_cast<std::size_t>(s)];
}

void ActivationBuffers::use_head(int s) {
  if (s < 0) fail(fmt::format("CudaModel: activation slot {}", s));
  if (head_acts.empty()) head_acts.push_back({shared.res_f, shared.hf, shared.rstd_f});  // slot 0: the shared ones
  while (static_cast<int>(head_acts.size()) <= s)
    head_acts.push_back({arena.alloc<bf16>(layout.head.res_f), arena.alloc<bf16>(layout.head.hf),
                         arena.alloc<float>(layout.head.rstd_f)});
  const HeadActs& h = head_acts[static_cast<std::size_t>(s)];
  shared.res_f = h.res_f, shared.hf = h.hf, shared.rstd_f = h.rstd_f;
}

}  // namespace dlm::train::cuda
