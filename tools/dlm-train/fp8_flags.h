// Megatron's FP8 training flags (Transformer Engine's recipe, docs/training.md "FP8 training"): --fp8-format turns
// FP8 on for the layers' linear GEMMs on the GPU backend; the others shape the recipe. Without --fp8-format they
// change nothing, as in Megatron.
#pragma once

#include <string>

#include <boost/program_options.hpp>

#include "dlm/train/fp8.h"

namespace dlm::tools {

// The flags' words before they are checked.
struct Fp8Flags {
  std::string format, recipe = "delayed", amax_algo = "most_recent";
  int margin = 0, amax_history_len = 1, layers_at_start = 1, layers_at_end = 1;
  bool first_last_layers_bf16 = false;
};

void add_fp8_flags(boost::program_options::options_description& group, Fp8Flags& f);
// After notify: the checked recipe (a dlm::Error naming the flag for a value dlm does not take).
train::Fp8Options apply_fp8_flags(const Fp8Flags& f);

}  // namespace dlm::tools
