// FP8 recipe: flag values, Megatron's checks, the layer choice and the host reference of delayed scaling.
#include "dlm/train/fp8.h"

#include <algorithm>

#include <fmt/format.h>

#include "dlm/ckpt/model_config.h"
#include "dlm/common/error.h"

namespace dlm::train {

bool Fp8Options::layer_in_fp8(int layer, int num_layers) const {
  if (!enabled) return false;
  if (!first_last_layers_bf16) return true;
  return layer >= layers_at_start_in_bf16 && layer < num_layers - layers_at_end_in_bf16;
}

void Fp8Options::validate(int num_layers, int pipeline_stages) const {
  if (!enabled) return;
  if (margin < 0) fail(fmt::format("--fp8-margin: {} is negative", margin));
  if (amax_history_len < 1) fail(fmt::format("--fp8-amax-history-len: {} is not at least 1", amax_history_len));
  if (!first_last_layers_bf16) return;
  if (recipe == Recipe::kDelayed)
    fail("--first-last-layers-bf16: delayed scaling does not support first / last layers in bf16 (Megatron's rule); "
         "use --fp8-recipe tensorwise");
  const int per_stage = num_layers / std::max(pipeline_stages, 1);
  if (layers_at_start_in_bf16 < 0 || layers_at_start_in_bf16 > per_stage)
    fail(fmt::format("--num-layers-at-start-in-bf16: {} is not between 0 and the layers per pipeline stage ({})",
                     layers_at_start_in_bf16, per_stage));
  if (layers_at_end_in_bf16 < 0 || layers_at_end_in_bf16 > per_stage)
    fail(fmt::format("--num-layers-at-end-in-bf16: {} is not between 0 and the layers per pipeline stage ({})",
                     layers_at_end_in_bf16, per_stage));
}

std::string fp8_summary(const Fp8Options& o, const ckpt::ModelConfig& config) {
  if (!o.enabled) return {};
  const int L = config.num_layers;
  int layers = 0, moe = 0;
  for (int l = 0; l < L; ++l)
    if (o.layer_in_fp8(l, L)) ++layers, moe += config.is_moe_layer(l);
  std::string line = fmt::format("FP8: {} {}: the QKV/proj/fc1/fc2 GEMMs of {} of {} layers",
                                 o.format == Fp8Options::Format::kHybrid ? "hybrid" : "e4m3",
                                 o.recipe == Fp8Options::Recipe::kTensorwise ? "tensorwise" : "delayed", layers, L);
  std::vector<std::string> bf16;
  if (moe > 0) bf16.push_back(fmt::format("the MLP of its {} MoE layer{}", moe, moe == 1 ? "" : "s"));
  if (L > 0 && o.layer_in_fp8(L - 1, L) && !config.is_moe_layer(L - 1))
    bf16.push_back("the last layer's fc1/fc2 on a micro-batch whose loss is on some rows only (that MLP then runs on "
                   "those rows)");
  for (std::size_t i = 0; i < bf16.size(); ++i) line += (i == 0 ? "; in bf16: " : "; ") + bf16[i];
  return line;
}

Fp8Options::Format parse_fp8_format(const std::string& value) {
  if (value == "e4m3") return Fp8Options::Format::kE4m3;
  if (value == "hybrid") return Fp8Options::Format::kHybrid;
  fail(fmt::format("--fp8-format: '{}' is not e4m3 or hybrid", value));
}

Fp8Options::Recipe parse_fp8_recipe(const std::string& value) {
  if (value == "tensorwise") return Fp8Options::Recipe::kTensorwise;
  if (value == "delayed") return Fp8Options::Recipe::kDelayed;
  fail(fmt::format("--fp8-recipe: '{}' is not tensorwise or delayed (mxfp8, blockwise and custom are not implemented)",
                   value));
}

Fp8Options::AmaxAlgo parse_fp8_amax_algo(const std::string& value) {
  if (value == "max") return Fp8Options::AmaxAlgo::kMax;
  if (value == "most_recent") return Fp8Options::AmaxAlgo::kMostRecent;
  fail(fmt::format("--fp8-amax-compute-algo: '{}' is not max or most_recent", value));
}

float AmaxHistory::update(float fp8_max, float margin_factor, float previous) {
  std::rotate(window_.rbegin(), window_.rbegin() + 1, window_.rend());  // the oldest leaves, slot 0 is free
  window_.front() = current_;
  current_ = 0.0f;
  const float amax = algo_ == Fp8Options::AmaxAlgo::kMax ? *std::max_element(window_.begin(), window_.end())
                                                         : window_.front();
  return fp8_scale(amax, fp8_max, margin_factor, previous);
}

}  // namespace dlm::train
