// Samplers: MegaDLMs'/LLaDA's reverse diffusion process for masked diffusion models, and plain
// autoregressive sampling, written against a logits callback so they never name a model or a backend.
//
// Diffusion (gen_length G, steps S, block_length K; G % K == 0, S % (G / K) == 0):
//   x = left-padded prompt + G mask tokens; position ids = cumsum(attention) - 1.
//   For each block of K positions, left to right, its n masked positions are unmasked over S/(G/K)
//   steps, n // steps per step and one more in the first n % steps steps. Each step:
//     logits = f(x)  (cfg w > 0: also f(x with the prompt masked) = u, logits = u + (w + 1) (logits - u))
//     x0 = argmax(logits) when T = 0, else Gumbel-max in float64: argmax(top_p(logits) - T log(-log U))
//          (LLaDA's exp(l) / (-log U)^T, taken in log space: the same argmax, no overflow)
//     confidence = softmax(logits)[x0] in float64 (low_confidence) or U(0, 1) (random); -inf at
//          positions after the block and at positions already decoded
//     the k most confident positions of each row take x0 (ties: the lower position first).
//   The generated part is returned up to (not including) its first eos.
//   Opt-in (Fast-dLLM's parallel decoding): with confidence_threshold > 0 a step unmasks every masked
//   position of the block whose confidence exceeds the threshold (the most confident one at least),
//   and a block ends when it has no mask left, so steps are spent only where the model is unsure.
// AR: the next token of each row from its last position's logits: greedy at T = 0, else logits / T,
//   top-k, top-p, Gumbel-max draw; a row stops at eos.
// Random numbers come from a counter-based stream keyed by the seed (philox.h): one seed, one output.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dlm::train {

// A batch of sequences for the model: [rows, len] row-major; attention 0 marks left padding.
struct SequenceBatch {
  std::int64_t rows = 0, len = 0;
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> attention;
  std::vector<std::int32_t> position_ids;
};
// Fills `logits` with [rows, len, vocab] fp32 values for the batch.
using LogitsFn = std::function<void(const SequenceBatch& batch, std::vector<float>& logits)>;
// Optional fast path for greedy sampling (temperature 0, no guidance): per position of the batch the
// argmax over the vocabulary (first on ties) and its softmax probability, [rows, len] each, computed
// where the model runs so that no logits travel (the CUDA backend's greedy_tokens). Only columns
// [first, end) are read back: the model may skip the output layer elsewhere (values there unspecified).
using GreedyFn = std::function<void(const SequenceBatch& batch, std::int64_t first, std::int64_t end,
                                    std::vector<std::int32_t>& tokens, std::vector<float>& confidence)>;

enum class Remasking { kLowConfidence, kRandom };
Remasking parse_remasking(const std::string& name);  // "low_confidence" | "random"

struct DiffusionSamplingOptions {
  std::int64_t gen_length = 256;    // --max-new-tokens
  std::int64_t steps = 256;         // --sample-steps
  std::int64_t block_length = 256;  // --inference-block-size
  double temperature = 0.0;
  double top_p = 1.0;               // 1 disables
  double cfg_scale = 0.0;
  Remasking remasking = Remasking::kLowConfidence;
  std::int32_t mask_token = -1;
  std::optional<std::int32_t> eos;
  std::int32_t pad_token = 0;       // fills left padding (never attended)
  std::uint64_t seed = 0;
  double confidence_threshold = 0;  // --threshold: > 0 turns on parallel decoding (Fast-dLLM)
};

struct ArSamplingOptions {
  std::int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy
  std::int64_t top_k = 0;    // 0 disables
  double top_p = 1.0;        // 1 disables
  std::optional<std::int32_t> eos;
  std::int32_t pad_token = 0;
  std::uint64_t seed = 0;
};

// Throws dlm::Error naming the option when the shape rules above are broken.
void validate(const DiffusionSamplingOptions& options);

// Each prompt's generated tokens (not the prompt), cut at the first eos. `model_calls`, when given,
// receives the number of model evaluations (the cost parallel decoding saves). `greedy`, when given, is
// used instead of `model` at temperature 0 without guidance (the confidence is then fp32, not float64).
std::vector<std::vector<std::int32_t>> diffusion_generate(const LogitsFn& model, std::int64_t vocab,
                                                          std::span<const std::vector<std::int32_t>> prompts,
                                                          const DiffusionSamplingOptions& options,
                                                          std::int64_t* model_calls = nullptr,
                                                          const GreedyFn& greedy = nullptr);
std::vector<std::vector<std::int32_t>> ar_generate(const LogitsFn& model, std::int64_t vocab,
                                                   std::span<const std::vector<std::int32_t>> prompts,
                                                   const ArSamplingOptions& options);

// n masked positions over `steps` steps: n // steps each, the first n % steps one more.
std::vector<std::int64_t> transfer_counts(std::int64_t masked, std::int64_t steps);

}  // namespace dlm::train
