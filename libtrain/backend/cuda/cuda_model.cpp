// CudaModel: construction (this rank's tensors and where each sits in the device buffers) and parameters by
// name (see cuda_model.h; the training step is cuda_model_stage.cpp, the samplers' forward
// cuda_model_sampling.cpp).
// Activations kept for the backward per layer: the residual streams entering each norm (bf16), the normed
// inputs of the GEMMs, QKV before and after QK-norm + RoPE, the attention output and its lse, fc1's output
// and SwiGLU's; nothing is recomputed. The residual gradient is carried in bf16 (cuda_model_stage.cpp).
#include "dlm/train/cuda_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <string>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "cuda_model_impl.h"
#include "master_split.h"
#include "dlm/common/error.h"

namespace dlm::train {

namespace {
std::int64_t max_global_numel(const CudaModel::Impl& I) {
  std::int64_t most = 0;
  for (const auto& spec : I.specs) most = std::max(most, ckpt::element_count(spec.global_shape));
  return most;
}
}  // namespace

bool CudaModel::device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

CudaModel::CudaModel(ckpt::ModelConfig config, CudaShard shard, CudaOptions options)
    : impl_(std::make_unique<Impl>(options)) {
  auto& I = *impl_;
  config.validate();
  if (options.deferred_embedding_steps < 1)
    fail(fmt::format("CudaModel: deferred_embedding_steps {} (at least 1)", options.deferred_embedding_steps));
  if (!device_available()) fail("CudaModel: no CUDA device");
  const int hd = config.kv_channels;
  if (hd != 16 && hd != 32 && hd != 64 && hd != 128)
    fail(fmt::format("CudaModel: kv_channels {} unsupported (16, 32, 64 or 128)", hd));
  if (config.hidden_size % 8 != 0 || config.ffn_hidden_size % 8 != 0)
    fail("CudaModel: hidden_size and ffn_hidden_size must be multiples of 8");
  const auto& layout = shard.layout;
  layout.validate(config);
  if (layout.tp > 1 && !shard.tensor) fail("CudaModel: tensor parallelism needs the tensor group's device collectives");
  if (shard.tensor && (shard.tensor->size() != layout.tp || shard.tensor->rank() != shard.tensor_rank))
    fail(fmt::format("CudaModel: tensor rank {} of {} but its group has rank {} of {}", shard.tensor_rank, layout.tp,
                     shard.tensor->rank(), shard.tensor->size()));
  I.cfg = std::move(config);
  I.shard = shard;
  I.tp = layout.tp;
  I.sp = shard.sequence_parallel && layout.tp > 1;
  I.heads = I.cfg.num_attention_heads / I.tp, I.groups = I.cfg.num_query_groups / I.tp;
  I.ffn_local = I.cfg.ffn_hidden_size / I.tp;
  if (I.ffn_local % 8 != 0) fail("CudaModel: ffn_hidden_size / tensor-parallel size must be a multiple of 8");
  // The cross-entropy and greedy kernels read rows of logits 8 bf16 at a time.
  if (I.vpad() % 8 != 0)
    fail(fmt::format("CudaModel: each tensor-parallel rank's {} vocabulary rows must be a multiple of 8 (raise "
                     "--make-vocab-size-divisible-by)", I.vpad()));
  I.vocab_first = shard.tensor_rank * static_cast<std::int64_t>(I.vpad());
  I.vocab_local = std::clamp<std::int64_t>(I.cfg.vocab_size - I.vocab_first, 0, I.vpad());
  const ckpt::LayerRange range = ckpt::stage_layer_range(I.cfg, layout, shard.stage);
  I.first_layer = range.first, I.layers = range.count;
  I.pre = shard.stage == 0, I.post = shard.stage == layout.pp - 1;
  if (!I.whole()) I.timer.turn_off();
  if (I.layers == 0) fail(fmt::format("CudaModel: pipeline stage {} holds no layer", shard.stage));
  I.specs = ckpt::rank_shards(I.cfg, layout, shard.tensor_rank, shard.stage);
  for (std::size_t i = 0; i < I.specs.size(); ++i) {
    I.index[I.specs[i].name] = static_cast<int>(i);
    I.offset.push_back(I.total);
    I.total += I.aligned_numel(static_cast<int>(i));
  }
  if (shard.optimizer_shards < 1 || shard.optimizer_rank < 0 || shard.optimizer_rank >= shard.optimizer_shards)
    fail(fmt::format("CudaModel: optimizer shard {} of {}", shard.optimizer_rank, shard.optimizer_shards));
  // Equal, aligned optimizer ranges (a reduce-scatter's blocks): the buffer grows to a multiple of them.
  const std::int64_t quantum = kAlign * shard.optimizer_shards;
  I.total = (I.total + quantum - 1) / quantum * quantum;
  I.opt_numel = I.total / shard.optimizer_shards;
  I.opt_first = I.opt_numel * shard.optimizer_rank;
  I.emb = I.find("embedding.word_embeddings.weight");
  I.lnf = I.find("decoder.final_layernorm.weight");
  I.out = I.cfg.tie_word_embeddings ? I.emb : I.find("output_layer.weight");
  for (int l = I.first_layer; l < I.first_layer + I.layers; ++l) {
    const std::string p = fmt::format("decoder.layers.{}.", l);
    I.lp.push_back({I.find(p + "self_attention.linear_qkv.layer_norm_weight"), I.find(p + "self_attention.linear_qkv.weight"),
                    I.find(p + "self_attention.q_layernorm.weight"), I.find(p + "self_attention.k_layernorm.weight"),
                    I.find(p + "self_attention.linear_proj.weight"), I.find(p + "mlp.linear_fc1.layer_norm_weight"),
                    I.find(p + "mlp.linear_fc1.weight"), I.find(p + "mlp.linear_fc2.weight")});
  }
  I.gemm_written.assign(I.specs.size(), 0);
  for (const auto& P : I.lp)
    for (int t : {P.qkv, P.proj, P.fc1, P.fc2}) I.gemm_written[static_cast<std::size_t>(t)] = 1;
  if (I.post && I.out != I.emb) I.gemm_written[static_cast<std::size_t>(I.out)] = 1;
  I.grad_fresh.assign(I.specs.size(), 0);
  I.build_zero_runs();
  if (I.shard.stream) I.stream = static_cast<cudaStream_t>(I.shard.stream), I.owns_stream = false;
  else check_cuda(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  I.graphs_off = !options.cuda_graphs;
  I.gemm = std::make_unique<Gemm>(!options.deterministic);
  I.swiglu_gemm = std::make_unique<SwigluBackwardGemm>();
  I.attention = std::make_unique<Attention>(
      options.attention == CudaOptions::Attention::kOwn ? Attention::Engine::kOwn : Attention::Engine::kAuto,
      options.deterministic);
  // The optimizer state (the master weights' lower halves, moments) of the rank's range only; the bf16 weights
  // (the upper halves) and the gradients whole (the forward and backward need every weight; the gradients are
  // reduce-scattered in place).
  I.w16 = I.alloc<bf16>(I.total + I.opt_numel, I.owned, I.bytes);
  I.w_lo = reinterpret_cast<std::int16_t*>(I.w16 + I.total);
  I.grad = I.alloc<float>(I.total, I.owned, I.bytes);
  I.m = I.alloc<float>(I.opt_numel, I.owned, I.bytes);
  I.v = I.alloc<float>(I.opt_numel, I.owned, I.bytes);
  I.norm_offset.assign(I.specs.size(), -1);
  for (std::size_t i = 0; i < I.specs.size(); ++i)
    if (I.specs[i].is_norm) I.norm_offset[i] = I.norm_total, I.norm_total += I.aligned_numel(static_cast<int>(i));
  I.norms32 = I.alloc<float>(I.norm_total, I.owned, I.bytes);
  I.norms_owned = I.sharded() ? I.alloc<float>(I.norm_total, I.owned, I.bytes) : I.norms32;
  for (float* norms : {I.norms32, I.norms_owned})
    check_cuda(cudaMemsetAsync(norms, 0, sizeof(float) * I.norm_total, I.stream), "memset");
  check_cuda(cudaMemsetAsync(I.w16, 0, sizeof(bf16) * (I.total + I.opt_numel), I.stream), "memset");
  check_cuda(cudaMemsetAsync(I.m, 0, sizeof(float) * I.opt_numel, I.stream), "memset");
  check_cuda(cudaMemsetAsync(I.v, 0, sizeof(float) * I.opt_numel, I.stream), "memset");
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
  // The gradient norm counts the tensors this rank saves (a replicated norm once, on tensor rank 0), in its
  // optimizer range (the ranges' sums add up over the data-parallel group).
  std::vector<int> listed;  // the spec of each entry of the list (adam_list leaves out those the range misses)
  for (int p = 0; p < static_cast<int>(I.specs.size()); ++p)
    if (I.moment_part(p).numel > 0) listed.push_back(p);
  std::vector<AdamWChunk> counted;
  for (const AdamWChunk& chunk : chunks)
    if (I.specs[static_cast<std::size_t>(listed[static_cast<std::size_t>(chunk.tensor)])].saved) counted.push_back(chunk);
  I.num_norm_chunks = static_cast<int>(counted.size());
  I.norm_chunks = I.alloc<AdamWChunk>(I.num_norm_chunks, I.owned, I.bytes);
  if (!counted.empty())
    check_cuda(cudaMemcpyAsync(I.norm_chunks, counted.data(), counted.size() * sizeof(AdamWChunk), cudaMemcpyHostToDevice,
                               I.stream),
               "norm chunks");
  I.norm_partial = I.alloc<double>(I.num_chunks, I.owned, I.bytes);
  I.sumsq = I.alloc<double>(1, I.owned, I.bytes);
  check_cuda(cudaStreamSynchronize(I.stream), "CudaModel");
}

CudaModel::~CudaModel() {
  if (!impl_) return;
  impl_->free_acts();
  for (void* p : impl_->owned) cudaFree(p);
  impl_->gemm.reset();
  impl_->swiglu_gemm.reset();
  impl_->attention.reset();
  if (impl_->stream && impl_->owns_stream) cudaStreamDestroy(impl_->stream);
}

const ckpt::ModelConfig& CudaModel::config() const { return impl_->cfg; }
const CudaShard& CudaModel::shard() const { return impl_->shard; }
const CudaOptions& CudaModel::options() const { return impl_->options; }
const std::vector<ckpt::TensorShard>& CudaModel::tensors() const { return impl_->specs; }
bool CudaModel::pre_process() const { return impl_->pre; }
bool CudaModel::post_process() const { return impl_->post; }
std::int64_t CudaModel::parameter_count() const {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < impl_->specs.size(); ++i) n += impl_->numel(static_cast<int>(i));
  return n;
}
std::string CudaModel::profile_report() { return impl_->timer.report(); }

std::size_t CudaModel::device_bytes() const {
  return impl_->bytes + impl_->act_bytes + impl_->attention->workspace_bytes();
}
void CudaModel::set_recompute_layers(bool full) {
  auto& I = *impl_;
  if (full == I.recompute) return;
  synchronize();
  I.free_acts();
  I.recompute = full;
}
bool CudaModel::recompute_layers() const { return impl_->recompute; }

std::string CudaModel::attention_engine() const { return impl_->attention->engine(); }
void CudaModel::synchronize() const { check_cuda(cudaStreamSynchronize(impl_->stream), "step"); }

void CudaModel::init(std::uint64_t seed) {
  auto& I = *impl_;
  I.settle_embedding();
  // Tensor t of model_tensors() draws from counter stream t over its global shape; a shard copies its pieces
  // out of the whole tensor, drawn in a scratch buffer. With optimizer shards each local tensor is made whole
  // in a second scratch buffer, so its bf16 copy comes from all of it, then the range keeps its part.
  std::unordered_map<std::string, std::uint32_t> global_index;
  for (const auto& spec : ckpt::model_tensors(I.cfg)) global_index.emplace(spec.name, static_cast<std::uint32_t>(global_index.size()));
  float *global = nullptr, *local = nullptr;
  const auto scratch = [&](float*& buffer, std::int64_t numel) {
    if (!buffer) check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&buffer), sizeof(float) * numel, I.stream), "init");
    return buffer;
  };
  std::int64_t most_local = 0;
  for (std::size_t i = 0; i < I.specs.size(); ++i) most_local = std::max(most_local, I.numel(static_cast<int>(i)));
  for (std::size_t i = 0; i < I.specs.size(); ++i) {
    const auto& spec = I.specs[i];
    const int p = static_cast<int>(i);
    float* values = scratch(local, most_local);
    if (spec.is_norm) {
      fill_f32(values, 1.0f, I.numel(p), I.stream);
    } else if (spec.local_shape == spec.global_shape) {
      init_normal_counter(values, I.numel(p), I.cfg.init_method_std, seed, global_index.at(spec.name), I.stream);
    } else {
      const std::int64_t rows = spec.global_shape[0], cols = spec.global_shape[1], local_cols = spec.local_shape[1];
      scratch(global, max_global_numel(I));
      init_normal_counter(global, rows * cols, I.cfg.init_method_std, seed, global_index.at(spec.name), I.stream);
      for (const ckpt::ShardPiece& piece : spec.pieces) {
        const bool by_rows = piece.dim == 0;
        check_cuda(cudaMemcpy2DAsync(values + (by_rows ? piece.local_start * cols : piece.local_start), local_cols * 4,
                                     global + (by_rows ? piece.global_start * cols : piece.global_start), cols * 4,
                                     (by_rows ? cols : piece.length) * 4, by_rows ? piece.length : rows,
                                     cudaMemcpyDeviceToDevice, I.stream),
                   "init shard");
      }
    }
    I.set_weights(p, values);
  }
  for (float* buffer : {global, local})
    if (buffer) check_cuda(cudaFreeAsync(buffer, I.stream), "init");
  synchronize();
}

void CudaModel::import_parameter(std::string_view name, std::span<const float> values) {
  auto& I = *impl_;
  const int p = I.find(std::string(name));
  if (p < 0) fail(fmt::format("CudaModel: no parameter '{}'", name));
  if (static_cast<std::int64_t>(values.size()) != I.numel(p))
    fail(fmt::format("CudaModel: '{}' has {} elements, got {}", name, I.numel(p), values.size()));
  I.settle_embedding();
  float* scratch = nullptr;  // the whole tensor in fp32, split into the halves
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&scratch), std::max<std::size_t>(values.size(), 1) * 4, I.stream),
             "import");
  check_cuda(cudaMemcpyAsync(scratch, values.data(), values.size() * 4, cudaMemcpyHostToDevice, I.stream), "import");
  I.set_weights(p, scratch);
  check_cuda(cudaFreeAsync(scratch, I.stream), "import");
  synchronize();
}

std::vector<float> CudaModel::Impl::export_master(int p) const {
  std::vector<float> out(static_cast<std::size_t>(numel(p)), 0.0f);
  const MomentPart part = moment_part(p);
  if (part.numel > 0) {
    const auto n = static_cast<std::size_t>(part.numel);
    std::vector<std::uint16_t> hi(n);
    std::vector<std::int16_t> lo(n);
    check_cuda(cudaMemcpyAsync(hi.data(), w16 + offset[p] + part.in_tensor, n * 2, cudaMemcpyDeviceToHost, stream),
               "export");
    check_cuda(cudaMemcpyAsync(lo.data(), w_lo + part.in_moments, n * 2, cudaMemcpyDeviceToHost, stream), "export");
    check_cuda(cudaStreamSynchronize(stream), "export");
    for (std::size_t i = 0; i < n; ++i)
      out[static_cast<std::size_t>(part.in_tensor) + i] = std::bit_cast<float>(cuda::join_master_bits(hi[i], lo[i]));
  }
  return out;
}

std::vector<float> CudaModel::export_parameter(std::string_view name) const {
  impl_->settle_embedding();
  return impl_->export_master(impl_->find_or_fail(name));
}

std::vector<float> CudaModel::export_gradient(std::string_view name) const {
  const int p = impl_->find(std::string(name));
  if (p < 0) fail(fmt::format("CudaModel: no parameter '{}'", name));
  if (impl_->grad_fresh[static_cast<std::size_t>(p)]) return std::vector<float>(static_cast<std::size_t>(impl_->numel(p)), 0.0f);
  synchronize();
  return download(impl_->G(p), impl_->numel(p), impl_->stream);
}

void CudaModel::zero_grad() {
  auto& I = *impl_;
  for (const auto& [first, count] : I.zero_runs)
    check_cuda(cudaMemsetAsync(I.grad + first, 0, sizeof(float) * count, I.stream), "zero_grad");
  if (I.sparse_emb) cuda::clear_written_rows(I.G(I.emb), I.emb_rows_written, I.numel(I.emb) / I.d(), I.d(), I.stream);
  I.grad_fresh = I.gemm_written;
}


}  // namespace dlm::train
