// CudaModel: construction (what this rank runs, its parameter store, engines and RoPE tables), the activations'
// shape, and parameters and gradients by name (see cuda_model.h; the training step is cuda_model_stage.cpp, the
// samplers' forward cuda_model_sampling.cpp, the state's owners cuda_model_impl.h).
// Activations kept for the backward per layer (LayerActs, activations.h): the residual streams entering each norm
// (bf16), the normed inputs of the GEMMs, QKV before and after QK-norm + RoPE, the attention output and its lse,
// fc1's output and SwiGLU's; under full recomputation (set_recompute_layers) only each layer's input, the rest
// recomputed before the layer's backward. The residual gradient is carried in bf16 (cuda_model_stage.cpp).
#include "dlm/train/cuda_model.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <numeric>
#include <string>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "cuda_model_impl.h"
#include "master_split.h"
#include "moe_kernels.h"
#include "dlm/common/error.h"

namespace dlm::train {

namespace {
std::int64_t max_global_numel(const CudaModel::Impl& I) {
  std::int64_t most = 0;
  for (const auto& spec : I.params.specs) most = std::max(most, ckpt::element_count(spec.global_shape));
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
  if (config.num_experts > 0) {
    if (config.num_experts > cuda::kMaxRouterExperts || config.moe_router_topk > 32)
      fail(fmt::format("CudaModel: {} experts, top-{} (the GPU router takes at most {} experts and top-32)",
                       config.num_experts, config.moe_router_topk, cuda::kMaxRouterExperts));
    if (config.moe_ffn_hidden_size % 8 != 0) fail("CudaModel: moe_ffn_hidden_size must be a multiple of 8");
    if (config.moe_shared_expert_intermediate_size % 8 != 0)
      fail("CudaModel: moe_shared_expert_intermediate_size must be a multiple of 8");
    if (options.fp8.enabled)
      fail("CudaModel: FP8 training of MoE models is not supported yet (train MoE models in bf16: drop --fp8-format)");
    if (options.fp8_sampling)
      fail("CudaModel: FP8 sampling of MoE models is not supported yet (sample MoE models in bf16: drop --fp8)");
    if (shard.layout.tp > 1)
      fail(fmt::format("CudaModel: tensor parallelism {} of MoE layers: the CUDA backend runs them without it (the CPU "
                       "backend has it: --device cpu)", shard.layout.tp));
  }
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
  if (layout.ep > 1 && (!shard.expert || shard.expert->size() != layout.ep || shard.expert->rank() != shard.expert_rank))
    fail(fmt::format("CudaModel: expert rank {} of {} needs its expert-parallel group's device collectives",
                     shard.expert_rank, layout.ep));
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
  if (shard.optimizer_shards < 1 || shard.optimizer_rank < 0 || shard.optimizer_rank >= shard.optimizer_shards)
    fail(fmt::format("CudaModel: optimizer shard {} of {}", shard.optimizer_rank, shard.optimizer_shards));
  if (I.shard.stream) I.stream = static_cast<cudaStream_t>(I.shard.stream), I.owns_stream = false;
  else check_cuda(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  I.params.allocate(ckpt::rank_shards(I.cfg, layout, shard.tensor_rank, shard.stage, shard.expert_rank),
                    shard.optimizer_shards, shard.optimizer_rank, I.stream);
  const ParameterStore& P = I.params;
  I.emb = P.find("embedding.word_embeddings.weight");
  I.lnf = P.find("decoder.final_layernorm.weight");
  I.out = I.cfg.tie_word_embeddings ? I.emb : P.find("output_layer.weight");
  for (int l = I.first_layer; l < I.first_layer + I.layers; ++l) {
    const std::string n = fmt::format("decoder.layers.{}.", l);
    LayerParams L{P.find(n + "self_attention.linear_qkv.layer_norm_weight"),
                  P.find(n + "self_attention.linear_qkv.weight"), P.find(n + "self_attention.q_layernorm.weight"),
                  P.find(n + "self_attention.k_layernorm.weight"), P.find(n + "self_attention.linear_proj.weight"),
                  P.find(n + "mlp.linear_fc1.layer_norm_weight"), P.find(n + "mlp.linear_fc1.weight"),
                  P.find(n + "mlp.linear_fc2.weight")};
    if (I.cfg.is_moe_layer(l)) {
      L.ln2 = P.find_or_fail(n + "pre_mlp_layernorm.weight");
      L.router = P.find_or_fail(n + "mlp.router.weight");
      L.experts_fc1 = P.find_or_fail(n + "mlp.experts.linear_fc1.weight");
      L.experts_fc2 = P.find_or_fail(n + "mlp.experts.linear_fc2.weight");
      L.fc1 = P.find(n + "mlp.shared_experts.linear_fc1.weight");  // -1 without a shared expert
      L.fc2 = P.find(n + "mlp.shared_experts.linear_fc2.weight");
    }
    I.lp.push_back(L);
  }
  // The experts' grouped weight-gradient GEMMs overwrite too (their empty experts cleared after them).
  I.fresh.gemm_written.assign(P.specs.size(), 0);
  for (const auto& L : I.lp)
    for (int t : {L.qkv, L.proj, L.fc1, L.fc2, L.router, L.experts_fc1, L.experts_fc2})
      if (t >= 0) I.fresh.gemm_written[static_cast<std::size_t>(t)] = 1;
  if (I.post && I.out != I.emb) I.fresh.gemm_written[static_cast<std::size_t>(I.out)] = 1;
  I.fresh.fresh.assign(P.specs.size(), 0);
  I.build_zero_runs();
  I.gemm = std::make_unique<Gemm>(!options.deterministic);
  std::vector<std::array<int, Fp8Linears::kLinears>> linears;  // per layer, the tensors FP8 may run
  for (const auto& L : I.lp) linears.push_back({L.qkv, L.proj, L.fc1, L.fc2});
  if (options.fp8.enabled) {
    options.fp8.validate(I.cfg.num_layers, layout.pp);
    I.fp8 = std::make_unique<Fp8Linears>(options.fp8, I.params, linears, I.first_layer, I.cfg.num_layers, I.stream);
  }
  if (options.fp8_sampling) {
    Fp8Options sampling;  // every layer, e4m3, each input scaled by its own amax
    sampling.enabled = true, sampling.format = Fp8Options::Format::kE4m3;
    sampling.recipe = Fp8Options::Recipe::kTensorwise;
    // The output layer too: the samplers run the whole model (sample_forward), whose head is the window step's
    // largest GEMM.
    I.sampling_fp8 = std::make_unique<Fp8Linears>(sampling, I.params, linears, I.first_layer, I.cfg.num_layers,
                                                  I.stream, Fp8Linears::Use::kForwardOnly, I.post ? I.out : -1);
  }
  I.swiglu_gemm = std::make_unique<SwigluBackwardGemm>();
  if (I.cfg.num_experts > 0) {
    I.grouped = std::make_unique<GroupedGemm>();
    if (!I.grouped->available())
      fail("CudaModel: MoE layers need the CUTLASS Hopper grouped GEMM (a build with CUTLASS, a compute capability 9.0 "
           "GPU)");
    if (I.cfg.moe_shared_expert_intermediate_size > 0)
      I.moe_side = std::make_unique<SideStream>(), I.moe_side_gemm = std::make_unique<Gemm>(!options.deterministic);
  }
  I.attention = std::make_unique<Attention>(
      options.attention == CudaOptions::Attention::kOwn ? Attention::Engine::kOwn : Attention::Engine::kAuto,
      options.deterministic);
  // RoPE tables in double, rounded once: angle = pos * theta^(-2i/D).
  const int half = hd / 2, max_pos = I.cfg.max_position_embeddings + 1;
  std::vector<float> c(static_cast<std::size_t>(max_pos) * half), s(c.size());
  for (int p = 0; p < max_pos; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = p * std::pow(I.cfg.rotary_base, -2.0 * i / hd);
      c[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::cos(a));
      s[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::sin(a));
    }
  I.rope_cos = I.tables.alloc<float>(static_cast<std::int64_t>(c.size()));
  I.rope_sin = I.tables.alloc<float>(static_cast<std::int64_t>(c.size()));
  // Every copy goes through the model's own stream: it is non-blocking, so a cudaMemcpy on the legacy stream
  // (which returns before a pageable upload lands) would not be ordered before the kernels that read it.
  check_cuda(cudaMemcpyAsync(I.rope_cos, c.data(), c.size() * 4, cudaMemcpyHostToDevice, I.stream), "copy rope");
  check_cuda(cudaMemcpyAsync(I.rope_sin, s.data(), s.size() * 4, cudaMemcpyHostToDevice, I.stream), "copy rope");
  check_cuda(cudaStreamSynchronize(I.stream), "CudaModel");
}

CudaModel::~CudaModel() {
  if (!impl_) return;
  auto& I = *impl_;
  I.free_acts();
  I.deferred.arena.release();
  I.tables.release();
  I.params.arena.release();
  I.gemm.reset();
  I.fp8.reset();
  I.sampling_fp8.reset();
  I.swiglu_gemm.reset();
  I.grouped.reset();
  I.moe_side_gemm.reset();
  I.moe_side.reset();
  I.attention.reset();
  if (I.stream && I.owns_stream) cudaStreamDestroy(I.stream);
}

const ckpt::ModelConfig& CudaModel::config() const { return impl_->cfg; }
const CudaShard& CudaModel::shard() const { return impl_->shard; }
const CudaOptions& CudaModel::options() const { return impl_->options; }
const std::vector<ckpt::TensorShard>& CudaModel::tensors() const { return impl_->params.specs; }
bool CudaModel::pre_process() const { return impl_->pre; }
bool CudaModel::post_process() const { return impl_->post; }
std::int64_t CudaModel::parameter_count() const {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < impl_->params.specs.size(); ++i) n += impl_->params.numel(static_cast<int>(i));
  return n;
}
std::string CudaModel::profile_report() { return impl_->timer.report(); }

std::size_t CudaModel::device_bytes() const {
  const auto& I = *impl_;
  return I.params.arena.bytes() + I.tables.bytes() + I.deferred.arena.bytes() + I.acts.arena.bytes() +
         I.inputs.arena.bytes() + I.moe.bytes() + I.dispatch.bytes() + I.attention->workspace_bytes() +
         (I.fp8 ? I.fp8->device_bytes() : 0) + (I.sampling_fp8 ? I.sampling_fp8->device_bytes() : 0);
}
void CudaModel::set_recompute_layers(bool full) {
  auto& I = *impl_;
  if (full == I.acts.recompute) return;
  synchronize();
  I.free_acts();
  I.acts.recompute = full;
}
bool CudaModel::recompute_layers() const { return impl_->acts.recompute; }

std::string CudaModel::attention_engine() const { return impl_->attention->engine(); }
void CudaModel::synchronize() const { check_cuda(cudaStreamSynchronize(impl_->stream), "step"); }

void CudaModel::init(std::uint64_t seed) {
  auto& I = *impl_;
  I.settle_embedding();
  I.before_state_write();
  // Tensor t of model_tensors() draws from counter stream t over its global shape; a shard copies its pieces
  // out of the whole tensor, drawn in a scratch buffer. With optimizer shards each local tensor is made whole
  // in a second scratch buffer, so its bf16 copy comes from all of it, then the range keeps its part.
  std::unordered_map<std::string, std::uint32_t> global_index;
  for (const auto& spec : ckpt::model_tensors(I.cfg))
    global_index.emplace(spec.name, static_cast<std::uint32_t>(global_index.size()));
  float *global = nullptr, *local = nullptr;
  const auto scratch = [&](float*& buffer, std::int64_t numel) {
    if (!buffer)
      check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&buffer), sizeof(float) * numel, I.stream), "init");
    return buffer;
  };
  std::int64_t most_local = 0;
  for (std::size_t i = 0; i < I.params.specs.size(); ++i)
    most_local = std::max(most_local, I.params.numel(static_cast<int>(i)));
  for (std::size_t i = 0; i < I.params.specs.size(); ++i) {
    const auto& spec = I.params.specs[i];
    const int p = static_cast<int>(i);
    float* values = scratch(local, most_local);
    if (spec.is_norm) {
      fill_f32(values, 1.0f, I.params.numel(p), I.stream);
    } else if (spec.local_shape == spec.global_shape) {
      init_normal_counter(values, I.params.numel(p), I.cfg.init_method_std, seed, global_index.at(spec.name), I.stream);
    } else {
      // Rows along dimension 0 (an expert's matrix is one row of the experts' [E, m, n] under expert parallelism).
      const std::int64_t rows = spec.global_shape[0], cols = ckpt::element_count(spec.global_shape) / rows,
                         local_cols = ckpt::element_count(spec.local_shape) / spec.local_shape[0];
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
    I.params.set_weights(p, values);
  }
  for (float* buffer : {global, local})
    if (buffer) check_cuda(cudaFreeAsync(buffer, I.stream), "init");
  I.weights_changed();
  synchronize();
}

void CudaModel::import_parameter(std::string_view name, std::span<const float> values) {
  auto& I = *impl_;
  const int p = I.params.find_or_fail(name);
  if (static_cast<std::int64_t>(values.size()) != I.params.numel(p))
    fail(fmt::format("CudaModel: '{}' has {} elements, got {}", name, I.params.numel(p), values.size()));
  I.settle_embedding();
  I.before_state_write();
  float* scratch = nullptr;  // the whole tensor in fp32, split into the halves
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&scratch), std::max<std::size_t>(values.size(), 1) * 4, I.stream),
             "import");
  check_cuda(cudaMemcpyAsync(scratch, values.data(), values.size() * 4, cudaMemcpyHostToDevice, I.stream), "import");
  I.params.set_weights(p, scratch);
  I.weights_changed();
  check_cuda(cudaFreeAsync(scratch, I.stream), "import");
  synchronize();
}

std::vector<float> CudaModel::export_parameter(std::string_view name) const {
  impl_->settle_embedding();
  return impl_->params.export_master(impl_->params.find_or_fail(name));
}

std::vector<std::vector<float>> CudaModel::export_parameters() {
  impl_->settle_embedding();
  return impl_->params.export_masters();
}

void CudaModel::release_host_buffers() { impl_->params.release_pinned(); }

void CudaModel::reserve_state_copy() { impl_->state_copy.reserve(impl_->params); }
void CudaModel::begin_state_copy(bool moments) {
  auto& I = *impl_;
  I.settle_embedding();
  I.state_copy.enqueue(I.params, I.stream, moments);
}
void CudaModel::finish_state_copy() const { impl_->state_copy.wait(); }
std::span<const float> CudaModel::copied_parameter(int p) const { return impl_->state_copy.master(p); }
std::span<const float> CudaModel::copied_exp_avg(int p) const { return impl_->state_copy.exp_avg(p); }
std::span<const float> CudaModel::copied_exp_avg_sq(int p) const { return impl_->state_copy.exp_avg_sq(p); }

std::vector<float> CudaModel::export_gradient(std::string_view name) const {
  const int p = impl_->params.find_or_fail(name);
  if (impl_->fresh.fresh[static_cast<std::size_t>(p)])
    return std::vector<float>(static_cast<std::size_t>(impl_->params.numel(p)), 0.0f);
  synchronize();
  return download(impl_->params.G(p), impl_->params.numel(p), impl_->stream);
}

void CudaModel::zero_grad() {
  auto& I = *impl_;
  I.fresh.zero(I.params, I.stream);
  // The sparse embedding left zero_runs: its flagged rows are cleared (and their flags with them).
  if (I.deferred.on)
    cuda::clear_written_rows(I.params.G(I.emb), I.deferred.written, I.params.numel(I.emb) / I.d(), I.d(), I.stream);
}

void CudaModel::Impl::ensure_acts(std::int64_t batch, std::int64_t seq) {
  if (batch == acts.B && seq == acts.S && acts.T > 0) return;
  free_acts();
  const std::int64_t T = batch * seq;
  const CudaActivationLayout layout = cuda_activation_layout(cfg, T, tp, sp, pre, post);
  const QkvShape qs{static_cast<int>(T), heads, groups, cfg.kv_channels, cfg.qk_layernorm, 0};
  const std::int64_t partial = std::max(rmsnorm_partial_floats(static_cast<int>(T), d()), qk_norm_partial_floats(qs));
  acts.allocate(layout, batch, seq, partial, stream);
  if (sampling_fp8) sampling_fp8->reserve_rows(T);  // free_acts dropped the captured forwards that held its buffer
  if (cfg.num_experts > 0)
    moe.allocate({cfg.num_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size, cfg.hidden_size,
                  cfg.moe_shared_expert_intermediate_size, cfg.moe_expert_capacity_factor,
                  cfg.moe_token_drop_policy == ckpt::MoeDropPolicy::kPosition},
                 T);
}

}  // namespace dlm::train
