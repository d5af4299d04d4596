// FP8 training's recipe, as Megatron-LM (Transformer Engine) names it: which linear layers run their GEMMs in
// FP8, in which formats, and how each FP8 tensor's scaling factor follows its values. Host code and CUDA code
// share the scale arithmetic below (the device update kernel and the host reference the tests hold it to).
//
// Per-tensor scaling: x_fp8 = saturate(x * scale), the GEMM multiplies by scale_inv = 1 / scale again.
//   scale = fp8_max / amax / 2^margin, where amax is
//     tensorwise (current scaling):  max|x| of the tensor being cast (one pass before, or fused in its producer);
//     delayed:                        taken from a history of the last `history_len` amaxes of the tensor,
//                                     `max` of the window or the `most_recent` entry (Megatron's default);
//   an amax of 0 or one that is not finite keeps the previous scale (Transformer Engine's rule), and a scale that
//   overflows fp32 (a tiny amax) becomes FLT_MAX.
// Formats: e4m3 (max 448) for activations and weights; the gradients entering a layer's backward GEMMs are e5m2
// (max 57344) under `hybrid`, e4m3 under `e4m3`.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#ifdef __CUDACC__
#define DLM_FP8_HD __host__ __device__
#else
#define DLM_FP8_HD
#endif

namespace dlm::ckpt {
struct ModelConfig;
}

namespace dlm::train {

constexpr float kFp8E4m3Max = 448.0f;
constexpr float kFp8E5m2Max = 57344.0f;

// The scale for `amax` (see the header's comment); `margin_factor` is 2^-margin.
DLM_FP8_HD inline float fp8_scale(float amax, float fp8_max, float margin_factor, float previous) {
  if (!(amax > 0.0f && amax <= FLT_MAX)) return previous;  // 0, inf or NaN
  const float s = fp8_max / amax * margin_factor;
  return s <= FLT_MAX ? s : FLT_MAX;
}

// The rows of a transposed FP8 operand (its leading dimension, and the weight gradient GEMM's K): a tensor's rows
// padded to a multiple of 16, which cuBLASLt's FP8 GEMMs need of K and the leading dimensions. The transposed casts
// write the pad zero, so that a GEMM over the padded K sums what it would over the rows; the memory plan counts the
// padded rows.
DLM_FP8_HD constexpr std::int64_t fp8_padded_rows(std::int64_t rows) { return (rows + 15) / 16 * 16; }

struct Fp8Options {
  // Off by default: every GEMM in bf16.
  bool enabled = false;
  // --fp8-format: e4m3 everywhere, or hybrid (e5m2 gradients). Default: hybrid when enabled.
  enum class Format { kE4m3, kHybrid };
  Format format = Format::kHybrid;
  // --fp8-recipe: tensorwise (current scaling) or delayed (amax history). Default: delayed, Megatron's.
  enum class Recipe { kTensorwise, kDelayed };
  Recipe recipe = Recipe::kDelayed;
  // --fp8-margin: scale divided by 2^margin. Default: 0.
  int margin = 0;
  // --fp8-amax-history-len (delayed). Default: 1.
  int amax_history_len = 1;
  // --fp8-amax-compute-algo (delayed): the window's max, or its most recent entry. Default: most_recent.
  enum class AmaxAlgo { kMax, kMostRecent };
  AmaxAlgo amax_algo = AmaxAlgo::kMostRecent;
  // --first-last-layers-bf16 with --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16: those layers of
  // the whole model keep bf16 GEMMs. Defaults: off, 1, 1.
  bool first_last_layers_bf16 = false;
  int layers_at_start_in_bf16 = 1;
  int layers_at_end_in_bf16 = 1;

  float margin_factor() const { return std::ldexp(1.0f, -margin); }
  float grad_max() const { return format == Format::kHybrid ? kFp8E5m2Max : kFp8E4m3Max; }
  bool grads_e5m2() const { return format == Format::kHybrid; }
  // Whether layer `layer` (0-based, of `num_layers` in the whole model) runs its linear layers in FP8.
  bool layer_in_fp8(int layer, int num_layers) const;
  // Megatron's checks: a history of at least one, a margin >= 0, bf16 layer counts within the layers per
  // pipeline stage, and no --first-last-layers-bf16 under delayed scaling. dlm::Error naming the flag.
  void validate(int num_layers, int pipeline_stages) const;
};

// The line a trainer logs at start when FP8 is on ("" when off): the format and recipe, the layers of `config` whose
// QKV/proj/fc1/fc2 GEMMs run in FP8, and the GEMMs of those layers that stay bf16 (an MoE layer's MLP; the last
// layer's fc1/fc2 where the loss is on some rows only, as CudaModel then runs that MLP on those rows).
std::string fp8_summary(const Fp8Options& options, const ckpt::ModelConfig& config);

// Parsers of the flags' values; dlm::Error naming the flag and the choices for any other value.
Fp8Options::Format parse_fp8_format(const std::string& value);
Fp8Options::Recipe parse_fp8_recipe(const std::string& value);
Fp8Options::AmaxAlgo parse_fp8_amax_algo(const std::string& value);

// One tensor's delayed-scaling state on the host, the reference of the device update (fp8_update_delayed):
// `record` takes amaxes between updates (their max counts), `update` pushes that amax into the window (the oldest
// leaves), derives the amax by the algorithm and the new scale from it, and starts the next interval at 0.
class AmaxHistory {
 public:
  AmaxHistory(int length, Fp8Options::AmaxAlgo algo) : window_(static_cast<std::size_t>(length), 0.0f), algo_(algo) {}
  void record(float amax) { current_ = std::fmax(current_, amax); }
  // Returns the new scale (`previous` where the derived amax is 0 or not finite).
  float update(float fp8_max, float margin_factor, float previous);
  const std::vector<float>& window() const { return window_; }  // most recent first
 private:
  std::vector<float> window_;
  Fp8Options::AmaxAlgo algo_;
  float current_ = 0.0f;
};

}  // namespace dlm::train
