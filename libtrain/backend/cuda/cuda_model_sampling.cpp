// CudaModel's forward for the samplers (whole model only): logits to the host, or the greedy head on the
// device (argmax and its probability per position) for the columns the sampler can still change; with the
// block KV cache (KvCacheUse) a forward that stores every layer's K and V, or one of a window over them.
#include <algorithm>
#include <iterator>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "cuda_model_impl.h"
#include "dlm/common/error.h"

namespace dlm::train {

namespace {

// The store `kv` names for a storing forward of batch x seq: allocated (again) unless it holds that shape.
KvStore& store_for(CudaModel::Impl& I, int name, std::int64_t batch, std::int64_t seq) {
  auto& slot = I.kv.by_name[name];
  if (slot && slot->batch == batch && slot->seq == seq) return *slot;
  slot.reset();  // the old shape's memory first
  auto store = std::make_unique<KvStore>();
  store->batch = batch, store->seq = seq, store->serial = ++I.kv.serial;
  const std::int64_t n = batch * seq * I.groups * I.cfg.kv_channels;
  for (int l = 0; l < I.layers; ++l) store->k.push_back(store->arena.alloc<bf16>(n)), store->v.push_back(store->arena.alloc<bf16>(n));
  store->first = store->arena.alloc<int>(1);
  if (I.sampling_fp8 && I.sampling_fp8->input_slot_count() > 0)
    store->fp8_input_scales = store->arena.alloc<cuda::Fp8Slot>(I.sampling_fp8->input_slot_count());
  slot = std::move(store);
  return *slot;
}

}  // namespace

std::vector<float> CudaModel::forward_logits(std::int64_t batch, std::int64_t seq, bool causal,
                                             std::span<const std::int32_t> ids,
                                             std::span<const std::int32_t> positions, const KvCacheUse& kv) {
  const std::vector<std::int32_t> labels(ids.size(), 0);
  const std::vector<float> weights(ids.size(), 0.0f);
  std::vector<float> logits;
  sample_forward({batch, seq, causal, ids, labels, positions, weights}, &logits, nullptr, {0, seq}, kv);
  return logits;
}

void CudaModel::greedy_tokens(std::int64_t batch, std::int64_t seq, bool causal, std::span<const std::int32_t> ids,
                              std::span<const std::int32_t> positions, std::vector<std::int32_t>& tokens,
                              std::vector<float>& confidence, ColumnWindow window, const KvCacheUse& kv) {
  if (window.end < 0) window.end = seq;
  if (window.first < 0 || window.first >= window.end || window.end > seq)
    fail(fmt::format("CudaModel: greedy columns [{}, {}) outside a sequence of {}", window.first, window.end, seq));
  const std::vector<std::int32_t> labels(ids.size(), 0);
  const std::vector<float> weights(ids.size(), 0.0f);
  sample_forward({batch, seq, causal, ids, labels, positions, weights}, &confidence, &tokens, window, kv);
}

void CudaModel::release_kv_stores(std::span<const int> keep) {
  auto& stores = impl_->kv.by_name;
  for (auto it = stores.begin(); it != stores.end();)
    it = std::find(keep.begin(), keep.end(), it->first) == keep.end() ? stores.erase(it) : std::next(it);
}

void CudaModel::sample_forward(const CudaBatch& b, std::vector<float>* logits_out, std::vector<std::int32_t>* greedy,
                               ColumnWindow window, const KvCacheUse& kv) {
  auto& I = *impl_;
  if (!I.whole()) fail("CudaModel: sampling runs on the whole model (no tensor or pipeline parallelism)");
  I.settle_embedding();  // no deferred row may reach a captured graph
  // The columns [first, first + width) of each row run through the layers: every column, or a KV-cache window.
  std::int64_t first = 0, width = b.seq;
  KvPass pass;
  const bool windowed = kv.mode == KvCacheUse::Mode::kWindow;
  if (kv.mode != KvCacheUse::Mode::kNone && b.causal)
    fail("CudaModel: the sampling KV cache is for bidirectional attention (a diffusion model)");
  if (kv.mode == KvCacheUse::Mode::kStore) {
    upload_micro_batch(I, 0, b, Upload::kSampling);
    pass.store = &store_for(I, kv.store, b.batch, b.seq);
  } else if (windowed) {
    const auto found = I.kv.by_name.find(kv.store);
    if (found == I.kv.by_name.end() || !found->second)
      fail(fmt::format("CudaModel: a KV-cache window over store {}, which no storing forward filled", kv.store));
    KvStore& store = *found->second;
    if (store.batch != b.batch || store.seq != b.seq)
      fail(fmt::format("CudaModel: a window of a batch {} x {}, but store {} holds {} x {}", b.batch, b.seq, kv.store,
                       store.batch, store.seq));
    if (static_cast<std::int64_t>(b.ids.size()) != b.batch * b.seq ||
        (!b.positions.empty() && b.positions.size() != b.ids.size()))
      fail(fmt::format("CudaModel: a window's batch columns disagree with its shape {} x {}", b.batch, b.seq));
    first = kv.columns.first, width = kv.columns.end - first;
    if (first < 0 || width <= 0 || kv.columns.end > b.seq)
      fail(fmt::format("CudaModel: window columns [{}, {}) outside a sequence of {}", first, kv.columns.end, b.seq));
    if (greedy && (window.first < first || window.end > kv.columns.end))
      fail(fmt::format("CudaModel: greedy columns [{}, {}) outside the window [{}, {})", window.first, window.end, first,
                       kv.columns.end));
    // The window's ids and positions (a column's own position: its index when none are given).
    std::vector<std::int32_t> ids, positions;
    for (std::int64_t r = 0; r < b.batch; ++r)
      for (std::int64_t j = first; j < first + width; ++j) {
        const auto at = static_cast<std::size_t>(r * b.seq + j);
        ids.push_back(b.ids[at]);
        positions.push_back(b.positions.empty() ? static_cast<std::int32_t>(j) : b.positions[at]);
      }
    const std::vector<std::int32_t> labels(ids.size(), 0);
    const std::vector<float> weights(ids.size(), 0.0f);
    if (I.acts.T < b.batch * width) I.ensure_acts(b.batch, b.seq);  // the store's shape holds every window of it
    upload_micro_batch(I, 0, {b.batch, width, false, ids, labels, positions, weights}, Upload::kWindow);
    store.first_host = static_cast<int>(first);
    check_cuda(cudaMemcpyAsync(store.first, &store.first_host, sizeof(int), cudaMemcpyHostToDevice, I.stream),
               "window column");
    pass = {&store, static_cast<int>(first), static_cast<int>(width)};
  } else {
    upload_micro_batch(I, 0, b, Upload::kSampling);
  }
  const KvPass* kvp = pass.store ? &pass : nullptr;
  // FP8 sampling: the weights' copies cast here when they changed, never inside a captured forward.
  if (I.sampling_fp8) I.sampling_fp8->cast_weights(I.params, I.stream);
  const std::int64_t n = b.batch * width;  // the rows that ran
  const int d = I.d(), V = I.vpad();
  const cudaStream_t st = I.stream;
  auto& gm = *I.gemm;
  MicroInputs& in = I.inputs.sets[0];
  auto& la = I.slot_acts(0);
  SharedActs& w = I.acts.shared;
  const bf16* head_w = I.params.W(I.out);
  const std::int64_t chunk = I.acts.chunk;
  // FP8 sampling's output layer reads the final norm's FP8 rows (Fp8Linears::head_forward).
  Fp8Linears* f8_head = I.sampling_fp8 && I.sampling_fp8->has_head() ? I.sampling_fp8.get() : nullptr;
  if (greedy) {
    // Only the greedy window's rows go through the head: outside it the sampler changes nothing (earlier blocks
    // are decoded, later ones are not yet eligible), and the head is the largest GEMM of a short sequence.
    const std::int64_t head = window.end - window.first, rows_in = b.batch * head, skip = window.first - first;
    const bool all = head == width;
    if (!all) {
      // The greedy window's rows of every sequence, by index on the device (head_rows is free in a forward-only
      // pass), so that a captured forward holds no column position.
      std::vector<int> rows(static_cast<std::size_t>(rows_in));
      for (std::int64_t r = 0; r < b.batch; ++r)
        for (std::int64_t j = 0; j < head; ++j)
          rows[static_cast<std::size_t>(r * head + j)] = static_cast<int>(r * width + skip + j);
      check_cuda(cudaMemcpyAsync(in.head_rows, rows.data(), rows.size() * sizeof(int), cudaMemcpyHostToDevice, st),
                 "greedy rows");
    }
    // Sampling repeats one shape hundreds of times: after its first (eager) call, the forward and the greedy
    // head run as one CUDA graph, so ~300 launches cost one. The graph holds no column position (a window reads its
    // first column on the device, KvStore::first; the greedy rows are gathered by index), so one serves every block:
    // the exact sampler's and the storing forwards, and the dual cache's windows (one width). MoE layers too: their
    // grouped GEMMs read the experts' row counts on the device (moe_layer.h); not under expert parallelism, whose
    // counts exchange waits on the host (moe_dispatch.h): eager.
    const ForwardGraphCache::Shape shape{b.batch, b.seq, b.causal, head, static_cast<int>(kv.mode),
                                         pass.store ? pass.store->serial : 0, width};
    I.graphs.run(shape, I.attention->workspace_bytes(), I.timer.enabled() || I.shard.expert != nullptr, st, [&] {
      enqueue_forward(I, in, la, kvp);
      const bf16* head_in = w.hf;
      const fp8* head_in8 = f8_head ? f8_head->head_input() : nullptr;
      if (!all && f8_head) {
        // Packed into tmp, which is free once the forward has run: an FP8 row's d bytes as d / 2 bf16 (FP8 widths
        // are multiples of 16).
        cuda::gather_rows(reinterpret_cast<const bf16*>(head_in8), in.head_rows, static_cast<int>(rows_in), d / 2,
                          w.tmp, st);
        head_in8 = reinterpret_cast<const fp8*>(w.tmp);
      } else if (!all) {
        cuda::gather_rows(w.hf, in.head_rows, static_cast<int>(rows_in), d, w.tmp, st);
        head_in = w.tmp;
      }
      for (std::int64_t c0 = 0; c0 < rows_in; c0 += chunk) {
        const int rows = static_cast<int>(std::min<std::int64_t>(chunk, rows_in - c0));
        if (f8_head) f8_head->head_forward(gm, head_in8 + c0 * d, rows, w.logits, V, st);
        else gm.run(false, true, rows, V, d, head_in + c0 * d, d, head_w, d, w.logits, false, V, 0, st);
        // The labels and per-row loss columns are free in a forward-only pass.
        cuda::greedy_tokens(w.logits, V, rows, static_cast<int>(I.cfg.vocab_size), in.labels + c0, in.loss_rows + c0,
                            st);
      }
      I.timer.mark("greedy head", st);
      check_cuda(cudaGetLastError(), "greedy");
    });
    I.timer.finish();  // with CudaOptions::profile: this forward's phases (run eagerly) into profile_report()
    // [batch, seq] out, the greedy window's columns filled, 0 elsewhere.
    const std::int64_t all_columns = b.batch * b.seq;
    greedy->assign(static_cast<std::size_t>(all_columns), 0);
    logits_out->assign(static_cast<std::size_t>(all_columns), 0.0f);
    const std::size_t pitch = static_cast<std::size_t>(b.seq) * 4, row = static_cast<std::size_t>(head) * 4;
    check_cuda(cudaMemcpy2DAsync(greedy->data() + window.first, pitch, in.labels, row, row,
                                 static_cast<std::size_t>(b.batch), cudaMemcpyDeviceToHost, st),
               "greedy");
    check_cuda(cudaMemcpy2DAsync(logits_out->data() + window.first, pitch, in.loss_rows, row, row,
                                 static_cast<std::size_t>(b.batch), cudaMemcpyDeviceToHost, st),
               "greedy");
    synchronize();
    return;
  }
  enqueue_forward(I, in, la, kvp);
  const std::int64_t vocab = I.cfg.vocab_size;
  std::vector<bf16> host(static_cast<std::size_t>(n * vocab));
  for (std::int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int rows = static_cast<int>(std::min<std::int64_t>(chunk, n - c0));
    if (f8_head) f8_head->head_forward(gm, f8_head->head_input() + c0 * d, rows, w.logits, V, st);
    else gm.run(false, true, rows, V, d, w.hf + c0 * d, d, head_w, d, w.logits, false, V, 0, st);
    check_cuda(cudaMemcpy2DAsync(host.data() + c0 * vocab, vocab * sizeof(bf16), w.logits, V * sizeof(bf16),
                                 vocab * sizeof(bf16), rows, cudaMemcpyDeviceToHost, st),
               "logits");
    synchronize();
  }
  logits_out->resize(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) (*logits_out)[i] = __bfloat162float(host[i]);
}

}  // namespace dlm::train
