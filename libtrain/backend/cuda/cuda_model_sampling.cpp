// CudaModel's forward for the samplers (whole model only): logits to the host, or the greedy head on the
// device (argmax and its probability per position) for the columns the sampler can still change.
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "cuda_model_impl.h"
#include "dlm/common/error.h"

namespace dlm::train {

std::vector<float> CudaModel::forward_logits(std::int64_t batch, std::int64_t seq, bool causal,
                                             std::span<const std::int32_t> ids,
                                             std::span<const std::int32_t> positions) {
  const std::vector<std::int32_t> labels(ids.size(), 0);
  const std::vector<float> weights(ids.size(), 0.0f);
  std::vector<float> logits;
  sample_forward({batch, seq, causal, ids, labels, positions, weights}, &logits, nullptr, {0, seq});
  return logits;
}

void CudaModel::greedy_tokens(std::int64_t batch, std::int64_t seq, bool causal, std::span<const std::int32_t> ids,
                              std::span<const std::int32_t> positions, std::vector<std::int32_t>& tokens,
                              std::vector<float>& confidence, ColumnWindow window) {
  if (window.end < 0) window.end = seq;
  if (window.first < 0 || window.first >= window.end || window.end > seq)
    fail(fmt::format("CudaModel: greedy columns [{}, {}) outside a sequence of {}", window.first, window.end, seq));
  const std::vector<std::int32_t> labels(ids.size(), 0);
  const std::vector<float> weights(ids.size(), 0.0f);
  sample_forward({batch, seq, causal, ids, labels, positions, weights}, &confidence, &tokens, window);
}

void CudaModel::sample_forward(const CudaBatch& b, std::vector<float>* logits_out, std::vector<std::int32_t>* greedy,
                               ColumnWindow window) {
  auto& I = *impl_;
  if (!I.whole()) fail("CudaModel: sampling runs on the whole model (no tensor or pipeline parallelism)");
  I.settle_embedding();  // no deferred row may reach a captured graph
  upload_micro_batch(I, 0, b, Upload::kSampling);
  const std::int64_t n = b.batch * b.seq;
  const int d = I.d(), V = I.vpad();
  const cudaStream_t st = I.stream;
  auto& gm = *I.gemm;
  MicroInputs& in = I.inputs.sets[0];
  auto& la = I.slot_acts(0);
  SharedActs& w = I.acts.shared;
  const bf16* head_w = I.params.W(I.out);
  const std::int64_t chunk = I.acts.chunk;
  if (greedy) {
    // Only the window's rows go through the head: outside it the sampler changes nothing (earlier blocks
    // are decoded, later ones are not yet eligible), and the head is the largest GEMM of a short sequence.
    const std::int64_t width = window.end - window.first, rows_in = b.batch * width;
    const bool all = width == b.seq;
    // Sampling repeats one shape hundreds of times: after its first (eager) call, the forward and the greedy
    // head run as one CUDA graph, so ~300 launches cost one.
    const ForwardGraphCache::Shape shape{b.batch, b.seq, b.causal, window.first, window.end};
    I.graphs.run(shape, I.attention->workspace_bytes(), I.timer.enabled(), st, [&] {
      enqueue_forward(I, in, la);
      const bf16* head_in = w.hf;
      if (!all) {
        // The window's rows of every sequence, packed (tmp is free once the forward has run).
        const auto row = [&](std::int64_t columns) { return static_cast<std::size_t>(columns * d) * sizeof(bf16); };
        check_cuda(cudaMemcpy2DAsync(w.tmp, row(width), w.hf + window.first * d, row(b.seq), row(width),
                                     static_cast<std::size_t>(b.batch), cudaMemcpyDeviceToDevice, st),
                   "greedy rows");
        head_in = w.tmp;
      }
      for (std::int64_t c0 = 0; c0 < rows_in; c0 += chunk) {
        const int rows = static_cast<int>(std::min<std::int64_t>(chunk, rows_in - c0));
        gm.run(false, true, rows, V, d, head_in + c0 * d, d, head_w, d, w.logits, false, V, 0, st);
        // The labels and per-row loss columns are free in a forward-only pass.
        cuda::greedy_tokens(w.logits, V, rows, static_cast<int>(I.cfg.vocab_size), in.labels + c0, in.loss_rows + c0,
                            st);
      }
      check_cuda(cudaGetLastError(), "greedy");
    });
    // [batch, seq] out, the window's columns filled, 0 elsewhere.
    greedy->assign(static_cast<std::size_t>(n), 0);
    logits_out->assign(static_cast<std::size_t>(n), 0.0f);
    const std::size_t pitch = static_cast<std::size_t>(b.seq) * 4, row = static_cast<std::size_t>(width) * 4;
    check_cuda(cudaMemcpy2DAsync(greedy->data() + window.first, pitch, in.labels, row, row,
                                 static_cast<std::size_t>(b.batch), cudaMemcpyDeviceToHost, st),
               "greedy");
    check_cuda(cudaMemcpy2DAsync(logits_out->data() + window.first, pitch, in.loss_rows, row, row,
                                 static_cast<std::size_t>(b.batch), cudaMemcpyDeviceToHost, st),
               "greedy");
    synchronize();
    return;
  }
  enqueue_forward(I, in, la);
  const std::int64_t vocab = I.cfg.vocab_size;
  std::vector<bf16> host(static_cast<std::size_t>(n * vocab));
  for (std::int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int rows = static_cast<int>(std::min<std::int64_t>(chunk, n - c0));
    gm.run(false, true, rows, V, d, w.hf + c0 * d, d, head_w, d, w.logits, false, V, 0, st);
    check_cuda(cudaMemcpy2DAsync(host.data() + c0 * vocab, vocab * sizeof(bf16), w.logits, V * sizeof(bf16),
                                 vocab * sizeof(bf16), rows, cudaMemcpyDeviceToHost, st),
               "logits");
    synchronize();
  }
  logits_out->resize(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) (*logits_out)[i] = __bfloat162float(host[i]);
}

}  // namespace dlm::train
