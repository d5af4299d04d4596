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
// Opt-in (Fast-dLLM's block KV cache; kv_cache prefix or dual, diffusion_generate_cached): a step reuses
//   the keys and values the model computed at the block's last refresh for the columns it does not
//   recompute. In block [s, e), step t (t = 0, 1, ... within the block; R = cache_refresh):
//     t % R == 0 (R = 0: t == 0 only): refresh: logits = f(x) over every column, as the exact sampler's
//       step, and every layer's K, V of every column stored;
//     otherwise a window step: only columns [w, hi) run through the layers, w = s (or the first column
//       before s still masked, as the exact sampler may unmask it), hi = len (prefix) or e (dual);
//       at layer l their queries attend to K_l[c] = K_l(x)[c] computed now for c in [w, hi) and to the
//       stored K_l[c] for every other column (V alike). Prefix: the prompt and the earlier blocks come from
//       the store, the block and the masked suffix are recomputed; dual: the suffix comes from the store
//       too, so a step costs ~K rows instead of len. Only [w, hi)'s logits exist: other columns are not
//       eligible in that step (after the block they never are).
//   The approximation: a stored column's K_l (l > 0) was computed while the block held the masks of the
//   refresh step; it is refreshed at every block's first step, so nothing is carried over a block
//   boundary, where a whole block just turned from masks into tokens. With R = 1 every step refreshes
//   and the tokens are the exact sampler's. The random draws are addressed as in the exact sampler.
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

// The block KV cache (see the top): none (the exact sampler), prefix or dual.
enum class KvCache { kNone, kPrefix, kDual };
KvCache parse_kv_cache(const std::string& name);  // "none" | "prefix" | "dual"

// A model that keeps its keys and values between calls (Model::forward_storing_kv / forward_window):
//   full(batch, logits): LogitsFn's logits; also stores every layer's K, V of every column of the batch;
//   window(batch, first, end, logits): logits [rows, end - first, vocab] of the columns [first, end) of
//     each row, run from the batch's ids there, attending at every other column to the K, V the last
//     full() stored (a batch of the same shape and padding; its ids outside the window are not read).
using WindowLogitsFn = std::function<void(const SequenceBatch& batch, std::int64_t first, std::int64_t end,
                                          std::vector<float>& logits)>;
// The greedy fast path of a window (GreedyFn's contract): window() of the columns [first, end), then the argmax and
// its probability of the columns [first, read_end) (read_end <= end), [rows, len] each.
using WindowGreedyFn = std::function<void(const SequenceBatch& batch, std::int64_t first, std::int64_t end,
                                          std::int64_t read_end, std::vector<std::int32_t>& tokens,
                                          std::vector<float>& confidence)>;
// Optional greedy fast paths (both or neither; used at temperature 0 without guidance, as diffusion_generate's
// `greedy`): full_greedy is full() that reads back the greedy tokens of the columns [first, end) only.
struct CachedLogitsModel {
  LogitsFn full;
  WindowLogitsFn window;
  GreedyFn full_greedy;
  WindowGreedyFn window_greedy;
};

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
  KvCache kv_cache = KvCache::kNone;  // --kv-cache (diffusion_generate_cached)
  std::int64_t cache_refresh = 0;     // --cache-refresh R: a full step every R steps of a block; 0: its first only
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
// The same with the block KV cache (options.kv_cache prefix or dual; a dlm::Error for none). Temperature,
// top-p, remasking, guidance (both halves of the doubled batch cached) and parallel decoding as above.
std::vector<std::vector<std::int32_t>> diffusion_generate_cached(const CachedLogitsModel& model, std::int64_t vocab,
                                                                 std::span<const std::vector<std::int32_t>> prompts,
                                                                 const DiffusionSamplingOptions& options,
                                                                 std::int64_t* model_calls = nullptr);
std::vector<std::vector<std::int32_t>> ar_generate(const LogitsFn& model, std::int64_t vocab,
                                                   std::span<const std::vector<std::int32_t>> prompts,
                                                   const ArSamplingOptions& options);

// n masked positions over `steps` steps: n // steps each, the first n % steps one more.
std::vector<std::int64_t> transfer_counts(std::int64_t masked, std::int64_t steps);

}  // namespace dlm::train
