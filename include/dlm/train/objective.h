// Objectives: how a micro-batch of Megatron GPTDataset samples becomes the model's input and a weight
// per position, so that every objective is one weighted cross-entropy,
//     loss = sum_i weight_i * CE(logits_i, label_i),
// and the model, the backends and the gradient never need to know which objective is trained.
//
// kDiffusion is MegaDLMs' difflm-noshift (docs/training.md):
//   cut to r in [2, L] with probability varilen_prob (training only), un-shift (input = tokens[1:],
//   labels = labels[:-1], positions 1..L-1), per sequence t ~ U(0,1), masked = u_j < t with at least one
//   masked position, p_mask = masked count / (L-1), weight = loss_mask * masked / p_mask / sum(loss_mask).
// kDiffusionLlada is the LLaDA paper's: no un-shift, p = (1 - eps) t + eps, masked = u_j < p,
//   weight = loss_mask * masked / p / (B * L).
// kAutoregressive is Megatron's GPT loss: causal, weight = loss_mask / sum(loss_mask).
//
// Noise is drawn from a counter-based stream keyed by (seed, global sample index, position), so any
// batch layout, any number of ranks and a resumed run draw the same masks for the same sample.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dlm::train {

enum class ObjectiveKind { kDiffusion, kDiffusionLlada, kAutoregressive };

// "difflm-noshift" | "llada" | "vanilla" (MegaDLMs' --model-running-mode / --difflm-mask-schedule).
ObjectiveKind parse_objective_kind(const std::string& name);
const char* objective_kind_name(ObjectiveKind kind);

struct ObjectiveOptions {
  ObjectiveKind kind = ObjectiveKind::kDiffusion;
  std::int32_t mask_token = -1;   // --mask-token; required by the diffusion objectives
  double varilen_prob = 0.01;     // --difflm-varilen-prob
  double llada_eps = 1e-3;
  std::uint64_t seed = 1234;      // --seed
};

// Megatron GPTDataset's columns for `batch` samples of `seq` positions, row-major:
// tokens = sample[:-1], labels = sample[1:], loss_mask 0 on eod (--eod-mask-loss) and padding.
struct SampleBatch {
  std::int64_t batch = 0, seq = 0;
  std::vector<std::int32_t> tokens, labels;
  std::vector<float> loss_mask;
  std::vector<std::uint64_t> sample_index;  // [batch]: each sample's global index, the noise key
};

// The model's input for one micro-batch, [batch, seq] row-major.
struct ModelBatch {
  std::int64_t batch = 0, seq = 0;
  bool causal = false;
  std::vector<std::int32_t> input_ids, labels, position_ids;
  std::vector<float> weights;
  std::vector<std::uint8_t> masked;  // 1 where the input holds the mask token (diffusion)
  // The weight of this micro-batch's MoE router losses (Model::backward): 1 / micro-batches, as Megatron's
  // MoEAuxLossAutoScaler scales them (the trainer sets it beside the weights' 1 / micro-batches).
  double router_loss_weight = 1.0;
};

// Where the micro-batch sits in the run. The variable-length draw is MegaDLMs': numpy's legacy
// RandomState seeded with iteration * num_micro_batches + micro_batch (iteration = completed iterations).
struct MicroBatchPosition {
  std::int64_t iteration = 0;
  std::int64_t num_micro_batches = 1;
  std::int64_t micro_batch = 0;
  bool training = true;  // validation never cuts the length
};

ModelBatch make_model_batch(const ObjectiveOptions& options, const SampleBatch& samples,
                            const MicroBatchPosition& where);

// MegaDLMs' draw: RandomState(seed): u = uniform(0, 1), r = randint(2, length + 1); r if u < prob else length.
std::int64_t variable_length(double prob, std::uint64_t seed, std::int64_t length);

// Reference weighted cross-entropy on the host: returns sum_i w_i * CE_i (double accumulation) and,
// when `dlogits` is not empty, writes d loss / d logits = w_i * (softmax_i - onehot_i). logits: [B*seq, vocab].
double weighted_cross_entropy(std::span<const float> logits, std::int64_t vocab, const ModelBatch& batch,
                              std::span<float> dlogits = {});

}  // namespace dlm::train
