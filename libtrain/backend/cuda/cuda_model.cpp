// CudaModel: the training step as one sequence of kernels on one stream (see cuda_model.h).
// Activations kept for the backward per layer: the residual streams entering each norm (bf16), the normed
// inputs of the GEMMs, QKV before and after QK-norm + RoPE, the attention output and its lse, fc1's output
// and SwiGLU's; nothing is recomputed. The residual gradient is carried in fp32.
#include "dlm/train/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "cuda_model_impl.h"
#include "dlm/common/error.h"

namespace dlm::train {

bool CudaModel::device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

CudaModel::CudaModel(ckpt::ModelConfig config) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  config.validate();
  if (!device_available()) fail("CudaModel: no CUDA device");
  const int hd = config.kv_channels;
  if (hd != 16 && hd != 32 && hd != 64 && hd != 128)
    fail(fmt::format("CudaModel: kv_channels {} unsupported (16, 32, 64 or 128)", hd));
  if (config.hidden_size % 8 != 0 || config.ffn_hidden_size % 8 != 0)
    fail("CudaModel: hidden_size and ffn_hidden_size must be multiples of 8");
  I.cfg = std::move(config);
  I.specs = ckpt::model_tensors(I.cfg);
  for (std::size_t i = 0; i < I.specs.size(); ++i) {
    I.index[I.specs[i].name] = static_cast<int>(i);
    I.offset.push_back(I.total);
    // The output layer's GEMMs run over the padded vocabulary: its rows past vocab_size exist (zero).
    const bool out_rows = I.specs[i].name == (I.cfg.tie_word_embeddings ? "embedding.word_embeddings.weight"
                                                                          : "output_layer.weight");
    const std::int64_t n = out_rows ? I.cfg.padded_vocab_size() * I.cfg.hidden_size : I.numel(static_cast<int>(i));
    I.total += (std::max(n, I.numel(static_cast<int>(i))) + kAlign - 1) / kAlign * kAlign;
  }
  I.emb = I.find("embedding.word_embeddings.weight");
  I.lnf = I.find("decoder.final_layernorm.weight");
  I.out = I.cfg.tie_word_embeddings ? I.emb : I.find("output_layer.weight");
  for (int l = 0; l < I.cfg.num_layers; ++l) {
    const std::string p = fmt::format("decoder.layers.{}.", l);
    I.lp.push_back({I.find(p + "self_attention.linear_qkv.layer_norm_weight"), I.find(p + "self_attention.linear_qkv.weight"),
                    I.find(p + "self_attention.q_layernorm.weight"), I.find(p + "self_attention.k_layernorm.weight"),
                    I.find(p + "self_attention.linear_proj.weight"), I.find(p + "mlp.linear_fc1.layer_norm_weight"),
                    I.find(p + "mlp.linear_fc1.weight"), I.find(p + "mlp.linear_fc2.weight")});
  }
  check_cuda(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const char* graphs = std::getenv("DLM_CUDA_GRAPHS");
  I.graphs_off = graphs && std::string_view(graphs) == "0";
  I.gemm = std::make_unique<Gemm>();
  I.attention = std::make_unique<Attention>();
  I.master = I.alloc<float>(I.total, I.owned, I.bytes);
  I.grad = I.alloc<float>(I.total, I.owned, I.bytes);
  I.m = I.alloc<float>(I.total, I.owned, I.bytes);
  I.v = I.alloc<float>(I.total, I.owned, I.bytes);
  I.w16 = I.alloc<bf16>(I.total, I.owned, I.bytes);
  check_cuda(cudaMemsetAsync(I.w16, 0, sizeof(bf16) * I.total, I.stream), "memset");
  check_cuda(cudaMemsetAsync(I.master, 0, sizeof(float) * I.total, I.stream), "memset");
  check_cuda(cudaMemsetAsync(I.m, 0, sizeof(float) * I.total, I.stream), "memset");
  check_cuda(cudaMemsetAsync(I.v, 0, sizeof(float) * I.total, I.stream), "memset");
  check_cuda(cudaMemsetAsync(I.grad, 0, sizeof(float) * I.total, I.stream), "memset");
  // RoPE tables in double, rounded once: angle = pos * theta^(-2i/D).
  const int half = hd / 2, max_pos = I.cfg.max_position_embeddings + 1;
  std::vector<float> c(static_cast<std::size_t>(max_pos) * half), s(c.size());
  for (int p = 0; p < max_pos; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = p * std::pow(I.cfg.rotary_base, -2.0 * i / hd);
      c[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::cos(a));
      s[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::sin(a));
    }
  I.rope_cos = I.alloc<float>(static_cast<std::int64_t>(c.size()), I.owned, I.bytes);
  I.rope_sin = I.alloc<float>(static_cast<std::int64_t>(c.size()), I.owned, I.bytes);
  // Every copy goes through the model's own stream: it is non-blocking, so a cudaMemcpy on the legacy stream
  // (which returns before a pageable upload lands) would not be ordered before the kernels that read it.
  check_cuda(cudaMemcpyAsync(I.rope_cos, c.data(), c.size() * 4, cudaMemcpyHostToDevice, I.stream), "copy rope");
  check_cuda(cudaMemcpyAsync(I.rope_sin, s.data(), s.size() * 4, cudaMemcpyHostToDevice, I.stream), "copy rope");
  I.adam_dev = I.alloc<AdamWTensor>(static_cast<std::int64_t>(I.specs.size()), I.owned, I.bytes);
  const std::vector<AdamWTensor> list = I.adam_list(0.0);
  const std::vector<AdamWChunk> chunks = adamw_chunks(list.data(), static_cast<int>(list.size()));
  I.num_chunks = static_cast<int>(chunks.size());
  I.adam_chunks = I.alloc<AdamWChunk>(I.num_chunks, I.owned, I.bytes);
  check_cuda(cudaMemcpyAsync(I.adam_chunks, chunks.data(), chunks.size() * sizeof(AdamWChunk), cudaMemcpyHostToDevice,
                             I.stream),
             "adamw chunks");
  I.norm_partial = I.alloc<double>(I.num_chunks, I.owned, I.bytes);
  I.sumsq = I.alloc<double>(1, I.owned, I.bytes);
  check_cuda(cudaStreamSynchronize(I.stream), "CudaModel");
}

CudaModel::~CudaModel() {
  if (!impl_) return;
  impl_->free_acts();
  for (void* p : impl_->owned) cudaFree(p);
  impl_->gemm.reset();
  impl_->attention.reset();
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

const ckpt::ModelConfig& CudaModel::config() const { return impl_->cfg; }
std::int64_t CudaModel::parameter_count() const {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < impl_->specs.size(); ++i) n += impl_->numel(static_cast<int>(i));
  return n;
}
std::string CudaModel::profile_report() { return impl_->timer.report(); }

std::size_t CudaModel::device_bytes() const {
  return impl_->bytes + impl_->act_bytes + impl_->attention->workspace_bytes();
}
std::string CudaModel::attention_engine() const { return impl_->attention->engine(); }
void CudaModel::synchronize() const { check_cuda(cudaStreamSynchronize(impl_->stream), "step"); }

void CudaModel::init(std::uint64_t seed) {
  auto& I = *impl_;
  for (std::size_t i = 0; i < I.specs.size(); ++i) {
    const int p = static_cast<int>(i);
    if (I.specs[i].is_norm) fill_f32(I.F(p), 1.0f, I.numel(p), I.stream);
    else init_normal_counter(I.F(p), I.numel(p), I.cfg.init_method_std, seed, static_cast<std::uint32_t>(i), I.stream);
    I.refresh_bf16(p);
  }
  synchronize();
}

void CudaModel::import_parameter(std::string_view name, std::span<const float> values) {
  auto& I = *impl_;
  const int p = I.find(std::string(name));
  if (p < 0) fail(fmt::format("CudaModel: no parameter '{}'", name));
  if (static_cast<std::int64_t>(values.size()) != I.numel(p))
    fail(fmt::format("CudaModel: '{}' has {} elements, got {}", name, I.numel(p), values.size()));
  check_cuda(cudaMemcpyAsync(I.F(p), values.data(), values.size() * 4, cudaMemcpyHostToDevice, I.stream), "import");
  I.refresh_bf16(p);
  synchronize();
}

namespace {
double download_loss(const float* rows, std::int64_t n, cudaStream_t stream) {
  double total = 0;
  for (float x : download(rows, n, stream)) total += x;
  return total;
}
}  // namespace

std::vector<float> CudaModel::export_parameter(std::string_view name) const {
  const int p = impl_->find(std::string(name));
  if (p < 0) fail(fmt::format("CudaModel: no parameter '{}'", name));
  synchronize();
  return download(impl_->F(p), impl_->numel(p), impl_->stream);
}

std::vector<float> CudaModel::export_gradient(std::string_view name) const {
  const int p = impl_->find(std::string(name));
  if (p < 0) fail(fmt::format("CudaModel: no parameter '{}'", name));
  synchronize();
  return download(impl_->G(p), impl_->numel(p), impl_->stream);
}

void CudaModel::zero_grad() {
  check_cuda(cudaMemsetAsync(impl_->grad, 0, sizeof(float) * impl_->total, impl_->stream), "zero_grad");
}

double CudaModel::forward_backward(const CudaBatch& b) { return step(b, nullptr); }
double CudaModel::forward_loss(const CudaBatch& b) { return step(b, nullptr, nullptr, true); }

std::vector<float> CudaModel::forward_logits(std::int64_t batch, std::int64_t seq, bool causal,
                                             std::span<const std::int32_t> ids,
                                             std::span<const std::int32_t> positions) {
  const std::vector<std::int32_t> labels(ids.size(), 0);
  const std::vector<float> weights(ids.size(), 0.0f);
  std::vector<float> logits;
  step({batch, seq, causal, ids, labels, positions, weights}, &logits);
  return logits;
}

void CudaModel::greedy_tokens(std::int64_t batch, std::int64_t seq, bool causal, std::span<const std::int32_t> ids,
                              std::span<const std::int32_t> positions, std::vector<std::int32_t>& tokens,
                              std::vector<float>& confidence) {
  const std::vector<std::int32_t> labels(ids.size(), 0);
  const std::vector<float> weights(ids.size(), 0.0f);
  step({batch, seq, causal, ids, labels, positions, weights}, &confidence, &tokens);
}

double CudaModel::step(const CudaBatch& b, std::vector<float>* logits_out, std::vector<std::int32_t>* greedy,
                       bool loss_only) {
  auto& I = *impl_;
  const auto& c = I.cfg;
  const std::int64_t n = b.batch * b.seq;
  if (b.batch <= 0 || b.seq <= 0 || static_cast<std::int64_t>(b.ids.size()) != n ||
      static_cast<std::int64_t>(b.labels.size()) != n || static_cast<std::int64_t>(b.weights.size()) != n ||
      (!b.positions.empty() && static_cast<std::int64_t>(b.positions.size()) != n))
    fail(fmt::format("CudaModel: micro-batch columns disagree with its shape {} x {}", b.batch, b.seq));
  if (b.seq > c.max_position_embeddings)
    fail(fmt::format("CudaModel: seq {} beyond max_position_embeddings {}", b.seq, c.max_position_embeddings));
  std::vector<std::int32_t> positions(b.positions.begin(), b.positions.end());
  if (positions.empty())
    for (std::int64_t i = 0; i < n; ++i) positions.push_back(static_cast<std::int32_t>(i % b.seq));
  for (std::int64_t i = 0; i < n; ++i) {
    if (b.ids[i] < 0 || b.ids[i] >= c.vocab_size)
      fail(fmt::format("CudaModel: token {} at position {} outside the vocabulary of {}", b.ids[i], i, c.vocab_size));
    if (b.weights[i] != 0 && (b.labels[i] < 0 || b.labels[i] >= c.vocab_size))
      fail(fmt::format("CudaModel: label {} at position {} outside the vocabulary of {}", b.labels[i], i, c.vocab_size));
    if (positions[i] < 0 || positions[i] > c.max_position_embeddings)
      fail(fmt::format("CudaModel: position {} at {} beyond max_position_embeddings", positions[i], i));
  }
  I.ensure_acts(b.batch, b.seq);
  const cudaStream_t st = I.stream;
  auto up = [&](void* dst, const void* src, std::size_t bytes) {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st), "upload");
  };
  up(I.ids, b.ids.data(), n * 4), up(I.pos, positions.data(), n * 4);
  const bool backward = !logits_out && !greedy && !loss_only;
  if (!logits_out && !greedy) up(I.labels, b.labels.data(), n * 4), up(I.weights, b.weights.data(), n * 4);
  // Tokens grouped by id for the embedding backward (deterministic, no atomics).
  std::vector<int> order;
  std::vector<EmbeddingSegment> segments;
  std::vector<EmbeddingCombine> combine;
  if (backward) {
    embedding_plan(b.ids.data(), static_cast<int>(n), order, segments, combine);
    up(I.order, order.data(), n * 4);
    up(I.emb_segments, segments.data(), segments.size() * sizeof(EmbeddingSegment));
    if (!combine.empty()) up(I.emb_combine, combine.data(), combine.size() * sizeof(EmbeddingCombine));
  }

  const int T = static_cast<int>(n), d = I.d(), F = I.ffn(), qd = I.qdim(), qkv = I.qkvdim(), V = I.vpad();
  const auto eps = static_cast<float>(c.norm_epsilon);
  const QkvShape qs{T, c.num_attention_heads, c.num_query_groups, c.kv_channels, c.qk_layernorm, eps};
  const AttentionShape as{static_cast<int>(b.batch), static_cast<int>(b.seq), c.num_attention_heads,
                          c.num_query_groups, c.kv_channels, b.causal};
  auto& gm = *I.gemm;
  const float* no_norm = nullptr;

  auto mark = [&](const char* phase) { I.timer.mark(phase, st); };
  const auto forward = [&] {
    I.timer.start(st);
    embedding_forward(I.ids, I.W(I.emb), I.la[0].res1, T, d, st);
    mark("embedding fwd");
    for (int l = 0; l < c.num_layers; ++l) {
      const auto& P = I.lp[static_cast<std::size_t>(l)];
      auto& A = I.la[static_cast<std::size_t>(l)];
      if (l == 0) rmsnorm_forward(A.res1, nullptr, nullptr, I.F(P.ln1), A.h1, A.rstd1, T, d, eps, st);
      else rmsnorm_forward(I.la[l - 1].res2, I.tmp, A.res1, I.F(P.ln1), A.h1, A.rstd1, T, d, eps, st);
      mark("rmsnorm fwd");
      gm.run(false, true, T, qkv, d, A.h1, d, I.W(P.qkv), d, A.qkv_raw, false, qkv, 0, st);
      mark("gemm qkv fwd");
      qk_norm_rope_forward(qs, A.qkv_raw, A.qkv_rot, A.qk_rstd, P.qn >= 0 ? I.F(P.qn) : no_norm,
                           P.kn >= 0 ? I.F(P.kn) : no_norm, I.pos, I.rope_cos, I.rope_sin, st);
      mark("qk-norm+rope fwd");
      I.attention->forward(as, A.qkv_rot, A.att, A.lse, st);
      mark("attention fwd");
      gm.run(false, true, T, d, qd, A.att, qd, I.W(P.proj), qd, I.tmp, false, d, 0, st);
      mark("gemm proj fwd");
      rmsnorm_forward(A.res1, I.tmp, A.res2, I.F(P.ln2), A.h2, A.rstd2, T, d, eps, st);
      mark("rmsnorm fwd");
      gm.run(false, true, T, 2 * F, d, A.h2, d, I.W(P.fc1), d, A.gu, false, 2 * F, 0, st);
      mark("gemm fc1 fwd");
      swiglu_forward(A.gu, A.act, T, F, st);
      mark("swiglu fwd");
      gm.run(false, true, T, d, F, A.act, F, I.W(P.fc2), F, I.tmp, false, d, 0, st);
      mark("gemm fc2 fwd");
    }
    rmsnorm_forward(I.la.back().res2, I.tmp, I.res_f, I.F(I.lnf), I.hf, I.rstd_f, T, d, eps, st);
    mark("rmsnorm fwd");
    check_cuda(cudaGetLastError(), "forward");
  };

  if (greedy) {
    // Sampling repeats one shape hundreds of times: after its first (eager) call, the forward and the greedy
    // head run as one CUDA graph, so ~300 launches cost one.
    I.run_graphed(b.batch, b.seq, b.causal, [&] {
      forward();
      for (std::int64_t c0 = 0; c0 < n; c0 += I.chunk) {
        const int rows = static_cast<int>(std::min<std::int64_t>(I.chunk, n - c0));
        gm.run(false, true, rows, V, d, I.hf + c0 * d, d, I.W(I.out), d, I.logits, false, V, 0, st);
        // The labels and per-row loss columns are free in a forward-only pass.
        cuda::greedy_tokens(I.logits, V, rows, static_cast<int>(c.vocab_size), I.labels + c0, I.loss_rows + c0, st);
      }
      check_cuda(cudaGetLastError(), "greedy");
    });
    greedy->resize(static_cast<std::size_t>(n));
    logits_out->resize(static_cast<std::size_t>(n));
    check_cuda(cudaMemcpyAsync(greedy->data(), I.labels, n * 4, cudaMemcpyDeviceToHost, st), "greedy");
    check_cuda(cudaMemcpyAsync(logits_out->data(), I.loss_rows, n * 4, cudaMemcpyDeviceToHost, st), "greedy");
    synchronize();
    return 0;
  }
  forward();
  if (logits_out) {
    const std::int64_t vocab = c.vocab_size;
    std::vector<bf16> host(static_cast<std::size_t>(n * vocab));
    for (std::int64_t c0 = 0; c0 < n; c0 += I.chunk) {
      const int rows = static_cast<int>(std::min<std::int64_t>(I.chunk, n - c0));
      gm.run(false, true, rows, V, d, I.hf + c0 * d, d, I.W(I.out), d, I.logits, false, V, 0, st);
      check_cuda(cudaMemcpy2DAsync(host.data() + c0 * vocab, vocab * sizeof(bf16), I.logits, V * sizeof(bf16),
                                   vocab * sizeof(bf16), rows, cudaMemcpyDeviceToHost, st),
                 "logits");
      synchronize();
    }
    logits_out->resize(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) (*logits_out)[i] = __bfloat162float(host[i]);
    return 0;
  }
  // Output layer and loss, a chunk of rows at a time: logits, in-place CE gradient, then both GEMMs back.
  for (std::int64_t c0 = 0; c0 < n; c0 += I.chunk) {
    const int rows = static_cast<int>(std::min<std::int64_t>(I.chunk, n - c0));
    gm.run(false, true, rows, V, d, I.hf + c0 * d, d, I.W(I.out), d, I.logits, false, V, 0, st);
    mark("gemm logits fwd");
    cross_entropy_forward_backward(I.logits, V, I.labels + c0, I.weights + c0, I.loss_rows + c0, rows,
                                   static_cast<int>(c.vocab_size), st);
    mark("cross-entropy");
    if (loss_only) continue;
    gm.run(false, false, rows, d, V, I.logits, V, I.W(I.out), d, I.dh + c0 * d, false, d, 0, st);
    gm.run(true, false, V, d, rows, I.logits, V, I.hf + c0 * d, d, I.G(I.out), true, d, 1, st);
    mark("gemm logits bwd");
  }
  if (loss_only) return download_loss(I.loss_rows, n, st);
  check_cuda(cudaMemsetAsync(I.dres, 0, sizeof(float) * n * d, st), "memset");
  rmsnorm_backward(I.dh, I.res_f, I.F(I.lnf), I.rstd_f, I.dres, I.dres16, I.G(I.lnf), I.partial, T, d, st);
  for (int l = c.num_layers - 1; l >= 0; --l) {
    const auto& P = I.lp[static_cast<std::size_t>(l)];
    auto& A = I.la[static_cast<std::size_t>(l)];
    mark("rmsnorm bwd");
    gm.run(true, false, d, F, T, I.dres16, d, A.act, F, I.G(P.fc2), true, F, 1, st);
    gm.run(false, false, T, F, d, I.dres16, d, I.W(P.fc2), F, I.dact, false, F, 0, st);
    mark("gemm fc2 bwd");
    swiglu_backward(I.dact, A.gu, I.dgu, T, F, st);
    mark("swiglu bwd");
    gm.run(true, false, 2 * F, d, T, I.dgu, 2 * F, A.h2, d, I.G(P.fc1), true, d, 1, st);
    gm.run(false, false, T, d, 2 * F, I.dgu, 2 * F, I.W(P.fc1), d, I.dh, false, d, 0, st);
    mark("gemm fc1 bwd");
    rmsnorm_backward(I.dh, A.res2, I.F(P.ln2), A.rstd2, I.dres, I.dres16, I.G(P.ln2), I.partial, T, d, st);
    mark("rmsnorm bwd");
    gm.run(true, false, d, qd, T, I.dres16, d, A.att, qd, I.G(P.proj), true, qd, 1, st);
    gm.run(false, false, T, qd, d, I.dres16, d, I.W(P.proj), qd, I.datt, false, qd, 0, st);
    mark("gemm proj bwd");
    I.attention->backward(as, A.qkv_rot, A.att, I.datt, A.lse, I.delta, I.dqkv_rot, st);
    mark("attention bwd");
    qk_norm_rope_backward(qs, I.dqkv_rot, A.qkv_raw, A.qk_rstd, P.qn >= 0 ? I.F(P.qn) : no_norm,
                          P.kn >= 0 ? I.F(P.kn) : no_norm, I.pos, I.rope_cos, I.rope_sin, I.dqkv,
                          P.qn >= 0 ? I.G(P.qn) : nullptr, P.kn >= 0 ? I.G(P.kn) : nullptr, I.partial, st);
    mark("qk-norm+rope bwd");
    gm.run(true, false, qkv, d, T, I.dqkv, qkv, A.h1, d, I.G(P.qkv), true, d, 1, st);
    gm.run(false, false, T, d, qkv, I.dqkv, qkv, I.W(P.qkv), d, I.dh, false, d, 0, st);
    mark("gemm qkv bwd");
    rmsnorm_backward(I.dh, A.res1, I.F(P.ln1), A.rstd1, I.dres, I.dres16, I.G(P.ln1), I.partial, T, d, st);
    if (I.layer_hook) I.layer_hook(l);
  }
  mark("rmsnorm bwd");
  embedding_backward(I.dres, I.order, I.emb_segments, static_cast<int>(segments.size()), I.emb_combine,
                     static_cast<int>(combine.size()), I.emb_partial, I.G(I.emb), d, st);
  mark("embedding bwd");
  I.timer.finish();
  check_cuda(cudaGetLastError(), "backward");
  return download_loss(I.loss_rows, n, st);
}

}  // namespace dlm::train
