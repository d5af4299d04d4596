// Memory and communication of a layout from the shapes (formulas: docs/parallelism.md).
//
// Per token and layer the backward pass keeps (e = bytes of an activation element, t = TP, s = t with
// --sequence-parallel else 1): the layer input, the attention-norm output, the post-attention
// residual and the MLP-norm output, 4h e / s; q, k, v after RoPE, the attention output, and q, k
// before the QK-norm when there is one, (2q + 2kv [+ q + kv]) e / t; the softmax statistics, 4 H / t;
// the fc1 output (gate, up) and the SwiGLU output, 3F e / t. The last stage adds the final norm's
// input and output, 2h e / s, and fp32 logits, 4 V / t. For the CUDA backend (cuda_backend) the activations
// are what it allocates instead (cuda_memory_plan.h).
// A mixture-of-experts layer keeps instead of the dense MLP's 3F e / t (balanced routing): the router's
// logits and scores, 2E 4 (fp32, replicated over TP); the k routed rows' fc1 and SwiGLU outputs, 3 k F_moe e / t;
// under expert parallelism the exchanged rows (the received inputs, their outputs, the outputs sent back), 3 k h e;
// a shared expert's fc1 and SwiGLU outputs, 3 S e / t. Under TP its collectives are the dense MLP's plus the
// all-reduce of the combine weights' gradient, k fp32 per token. Its
// all-to-all sends (EP - 1) / EP of the k h e routed bytes of each token four times a step (dispatch and combine,
// forward and backward). The CUDA backend's MoE buffers are not planned yet: an MoE model's plan uses the estimate.
#include "dlm/train/parallel_plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "dlm/ckpt/sharding.h"
#include "dlm/common/error.h"
#include "dlm/train/batch_plan.h"
#include "dlm/train/cuda_memory_plan.h"
#include "dlm/train/pipeline_schedule.h"

namespace dlm::train {
namespace {

std::string gib(double bytes) { return fmt::format("{:.2f}", bytes / (1024.0 * 1024.0 * 1024.0)); }

}  // namespace

ParallelPlan plan_parallel(const ckpt::ModelConfig& c, const PlanOptions& o) {
  if (o.tensor <= 0 || o.pipeline <= 0 || o.data <= 0) fail("the parallel sizes must be positive");
  if (o.micro_batch_size <= 0 || o.seq_length <= 0) fail("--micro-batch-size and --seq-length must be positive");
  const BatchPlan batches(o.global_batch_size, o.micro_batch_size, o.data);
  if (o.virtual_stages < 1 || (o.virtual_stages > 1 && o.pipeline < 2))
    fail("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size of at least 2");
  const int V = o.virtual_stages;
  ckpt::ParallelLayout layout{o.tensor, o.pipeline * V, o.data, {}};
  layout.ep = o.expert;
  if (o.expert < 1 || o.data % o.expert != 0)
    fail(fmt::format("--expert-model-parallel-size {} does not divide the data-parallel size {}", o.expert, o.data));
  layout.validate(c);
  const bool cuda_activations = o.cuda_backend && c.num_experts == 0;

  ParallelPlan plan;
  plan.options = o;
  plan.micro_batches_per_rank = batches.micro_batches_per_rank();
  for (const auto& spec : ckpt::model_tensors(c)) plan.model_parameters += ckpt::element_count(spec.shape);

  // As in Megatron, --sequence-parallel means nothing without TP (t = 1 gives s = 1).
  const double t = o.tensor, d = o.data, sp = o.sequence_parallel ? t : 1.0;
  const double e = o.bf16 ? 2 : 4;           // weight and activation element
  const double g = 4;                        // gradients: fp32
  // Optimizer state: fp32 master weights (bf16 only; the CUDA backend keeps them as the bf16 weights plus a
  // 16-bit remainder: 2 bytes) + exp_avg + exp_avg_sq.
  const double state = o.cuda_backend ? 10 : o.bf16 ? 12 : 8;
  const double h = c.hidden_size, q = static_cast<double>(c.q_size()), kv = static_cast<double>(c.kv_size());
  const double f = c.ffn_hidden_size, heads = c.num_attention_heads;
  const double v = static_cast<double>(c.padded_vocab_size());
  const double tokens = static_cast<double>(o.seq_length * o.micro_batch_size);
  const double per_token_layer = 4 * h * e / sp + (2 * q + 2 * kv + (c.qk_layernorm ? q + kv : 0)) * e / t +
                                 4 * heads / t + 3 * f * e / t;
  const double layer_full = tokens * per_token_layer;
  const double k = c.moe_router_topk, fm = c.moe_ffn_hidden_size, experts = c.num_experts, ep = o.expert;
  const double moe_layer_full =
      tokens * (per_token_layer - 3 * f * e / t + 8 * experts + 3 * k * fm * e / t + (ep > 1 ? 3 * k * h * e : 0) +
                3.0 * c.moe_shared_expert_intermediate_size * e / t);
  const double moe_a2a = 4 * tokens * k * h * e * (ep - 1) / ep;  // one MoE layer, one micro-batch
  const double layer_input = tokens * h * e / sp;
  const double last_extra = tokens * (2 * h * e / sp + 4 * v / t);
  const double hidden_bytes = tokens * h * e;  // one micro-batch's hidden states, whole sequence
  const double ring = (t - 1) / t;
  const auto n = static_cast<double>(plan.micro_batches_per_rank);

  for (int s = 0; s < o.pipeline; ++s) {
    StagePlan p;
    p.stage = s;
    p.ranks = o.tensor * o.data;
    p.first_rank = s * p.ranks;
    p.first_layer = ckpt::stage_layer_range(c, layout, s).first;
    // In-flight micro-batches per chunk: replay the schedule's order (what the trainer runs).
    std::vector<std::int64_t> in_flight(static_cast<std::size_t>(V), 0), peak(static_cast<std::size_t>(V), 0);
    for (const PipelineUnit& u : pipeline_order(o.pipeline, s, V, static_cast<int>(plan.micro_batches_per_rank))) {
      auto& k = in_flight[static_cast<std::size_t>(u.chunk)];
      k += u.forward ? 1 : -1;
      peak[static_cast<std::size_t>(u.chunk)] = std::max(peak[static_cast<std::size_t>(u.chunk)], k);
    }
    p.per_chunk_in_flight = peak;
    p.micro_batches_in_flight = *std::max_element(peak.begin(), peak.end());
    const double stored = o.recompute_full ? layer_input : layer_full;
    const double stored_moe = o.recompute_full ? layer_input : moe_layer_full;
    bool first = false, last = false;
    int sends = 0;
    double fp8_weights = 0;
    for (int v = 0; v < V; ++v) {
      const int stage = v * o.pipeline + s;
      const auto range = ckpt::stage_layer_range(c, layout, stage);
      p.layers += range.count;
      int moe = 0;
      for (int i = range.first; i < range.first + range.count; ++i) moe += c.is_moe_layer(i) ? 1 : 0;
      p.moe_layers += moe;
      for (const auto& shard : ckpt::rank_shards(c, layout, 0, stage)) {
        p.parameters += ckpt::element_count(shard.local_shape);
        if (shard.name.find(".mlp.experts.") != std::string::npos) p.expert_parameters += ckpt::element_count(shard.local_shape);
      }
      const auto held = static_cast<double>(peak[static_cast<std::size_t>(v)]);
      if (cuda_activations) {
        // Each chunk is a CudaModel of its own: its layers' slots, its work buffers, its uploaded inputs.
        const bool pre = stage == 0, post = stage == layout.pp - 1;
        const CudaActivationBytes b =
            cuda_activation_bytes(c, o.seq_length * o.micro_batch_size, o.tensor, o.sequence_parallel, pre, post,
                                  o.recompute_full);
        p.activations += held * range.count * b.per_layer_slot + b.shared + n * b.per_micro_batch_inputs +
                         (post ? std::max(held - 1, 0.0) * b.per_extra_head_slot : 0);
        int fp8_layers = 0;
        for (int l = range.first; l < range.first + range.count; ++l) fp8_layers += o.fp8.layer_in_fp8(l, c.num_layers);
        const CudaFp8Bytes f = cuda_fp8_bytes(c, o.seq_length * o.micro_batch_size, o.tensor);
        fp8_weights += fp8_layers * f.per_layer;
        p.activations += fp8_layers > 0 ? f.work : 0.0;
      } else {
        p.activations += held * ((range.count - moe) * stored + moe * stored_moe);
      }
      first = first || stage == 0;
      last = last || stage == layout.pp - 1;
      sends += (stage == layout.pp - 1 ? 0 : 1) + (stage == 0 ? 0 : 1);
    }
    const double params = static_cast<double>(p.parameters);
    p.weights = params * e + fp8_weights;
    p.gradients = params * g;
    // The distributed optimizer shards the experts' state over the expert-data-parallel group (d / EP ranks).
    const double expert_params = static_cast<double>(p.expert_parameters), dense_params = params - expert_params;
    const double edp = d / ep;
    p.optimizer = o.distributed_optimizer ? dense_params * state / d + expert_params * state / edp : params * state;
    p.expert_parallel_bytes = n * p.moe_layers * moe_a2a;
    if (cuda_activations)
      p.activations += kCudaRuntimeBytes + (o.tensor * o.pipeline * o.data > 1 ? kCudaNcclBytes : 0.0) +
                       (o.pipeline > 1 ? kCudaNcclPipelineBytes : 0.0);
    else p.activations += (o.recompute_full && p.layers > 0 ? layer_full : 0) + (last ? last_extra : 0);
    // Dense tensors over the data-parallel group, experts over the expert-data-parallel one.
    const auto dp_bytes = [&](double count, double ranks) {
      if (ranks <= 1) return 0.0;
      return o.distributed_optimizer ? count * (g + e) * (ranks - 1) / ranks : count * g * 2 * (ranks - 1) / ranks;
    };
    p.data_parallel_bytes = dp_bytes(dense_params, d) + dp_bytes(expert_params, edp);
    if (o.tensor > 1) {
      // Per layer: two all-reduces forward and two backward (or their all-gather + reduce-scatter pairs
      // with SP, the same bytes), 2 (t-1)/t of the hidden states each; a full recomputation repeats the
      // forward's. The embedding's all-reduce, the output layer's input gradient and the vocab-parallel
      // cross-entropy's three statistics (fp32 per token) come on top.
      const double per_layer = (8 + (o.recompute_full ? 4 : 0)) * ring * hidden_bytes;
      const double ends = (first ? 2 * ring * hidden_bytes : 0) + (last ? 2 * ring * hidden_bytes + 3 * 2 * ring * 4 * tokens : 0);
      p.tensor_parallel_bytes = n * (p.layers * per_layer + ends + p.moe_layers * 2 * ring * 4 * tokens * k);
    }
    if (o.pipeline > 1) p.pipeline_bytes = n * sends * hidden_bytes / sp;
    plan.stages.push_back(p);
  }
  return plan;
}

std::string format_plan(const ckpt::ModelConfig& c, const ParallelPlan& plan) {
  const auto& o = plan.options;
  std::string out = fmt::format(
      "dry run: {} layers, hidden {}, ffn {}, {} heads / {} KV groups, vocabulary {} (padded): {:.3f}B parameters\n"
      "layout: {} ranks = TP {} x DP {} x PP {}{}{}{}{}; micro-batch {}, global batch {}, sequence {} -> {} micro-batches "
      "per rank per step; {}; recomputation {}{}\n",
      c.num_layers, c.hidden_size, c.ffn_hidden_size, c.num_attention_heads, c.num_query_groups, c.padded_vocab_size(),
      static_cast<double>(plan.model_parameters) / 1e9, o.tensor * o.data * o.pipeline, o.tensor, o.data, o.pipeline,
      o.virtual_stages > 1 ? fmt::format(" (interleaved, {} chunks per rank)", o.virtual_stages) : "",
      o.expert > 1 ? fmt::format(", EP {}", o.expert) : "", o.sequence_parallel ? ", sequence parallel" : "", o.distributed_optimizer ? ", distributed optimizer" : "",
      o.micro_batch_size, o.global_batch_size, o.seq_length, plan.micro_batches_per_rank,
      std::string(o.bf16 ? "bf16 weights/activations, fp32 gradients and master weights" : "fp32") +
          (o.cuda_backend && o.fp8.enabled ? " (FP8 linear layers: their FP8 weight copies in weights)" : ""),
      o.recompute_full ? "full" : "off",
      o.cuda_backend && c.num_experts == 0 ? "; activations as the CUDA backend allocates them, its runtime included" : "");
  out += fmt::format("{:>5} {:>11} {:>7} {:>13} {:>9} {:>9} {:>9} {:>11} {:>9} | {:>9} {:>9} {:>9}\n", "stage", "ranks",
                     "layers", "params/rank", "weights", "grads", "optim", "activations", "total", "DP send", "TP send",
                     "PP send");
  for (const auto& s : plan.stages)
    out += fmt::format("{:>5} {:>11} {:>7} {:>13} {:>9} {:>9} {:>9} {:>11} {:>9} | {:>9} {:>9} {:>9}\n", s.stage,
                       fmt::format("{}-{}", s.first_rank, s.first_rank + s.ranks - 1),
                       !s.layers ? std::string("-")
                       : o.virtual_stages > 1 ? fmt::format("{}x{}", o.virtual_stages, s.layers / o.virtual_stages)
                                              : fmt::format("{}-{}", s.first_layer, s.first_layer + s.layers - 1),
                       s.parameters, gib(s.weights), gib(s.gradients), gib(s.optimizer), gib(s.activations),
                       gib(s.memory()), gib(s.data_parallel_bytes), gib(s.tensor_parallel_bytes), gib(s.pipeline_bytes));
  out += "memory in GiB per rank; sends in GiB per rank per step (ring collectives); every rank of a stage holds the same\n";
  if (c.num_experts == 0) return out;
  const double k = c.moe_router_topk, h = c.hidden_size, e = o.bf16 ? 2 : 4;
  const double tokens = static_cast<double>(o.seq_length * o.micro_batch_size);
  out += fmt::format(
      "mixture of experts: {} experts of FFN {}, top-{}; EP {} x expert DP {}: {} experts per rank and MoE layer{}; "
      "dispatch buffers {} GiB per MoE layer and micro-batch (k routed rows sent, received, returned){}\n",
      c.num_experts, c.moe_ffn_hidden_size, c.moe_router_topk, o.expert, o.data / o.expert, c.num_experts / o.expert,
      o.tensor > 1 ? fmt::format(", each split over TP {}", o.tensor) : "",
      gib(o.expert > 1 ? 3 * tokens * k * h * e : 0.0),
      o.cuda_backend ? "; activations: the estimate above (the CUDA backend's MoE buffers are not planned yet)" : "");
  out += fmt::format("{:>5} {:>10} {:>15} {:>13} {:>9}\n", "stage", "MoE layers", "expert params", "expert weights", "EP send");
  for (const auto& s : plan.stages)
    out += fmt::format("{:>5} {:>10} {:>15} {:>13} {:>9}\n", s.stage, s.moe_layers, s.expert_parameters,
                       gib(static_cast<double>(s.expert_parameters) * e), gib(s.expert_parallel_bytes));
  out += "expert params and weights per rank (GiB); EP send: all-to-all GiB per rank per step, balanced routing\n";
  return out;
}

}  // namespace dlm::train
