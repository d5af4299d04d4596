// Megatron's run arguments (the pickled argparse.Namespace of a checkpoint) as dlm's model config and
// as JSON (libckpt internal).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/pickle.h"

namespace dlm::ckpt::detail {

// The GPT shape args describe, for `tp` ranks. Refuses, naming the argument, a model dlm does not
// have (biases, MoE, LayerNorm, a non-gated MLP, learned position embeddings).
ModelConfig model_config_from_megatron_args(const PickleValue& args, int tp, const std::string& file);

// A pickled value as JSON: tensors become "<tensor float32 [4, 6]>", globals and objects their names.
// At most 1 Mi values-plus-string-bytes are written (values shared through the memo count each time
// they appear), so a pickle of nested shared lists cannot make it exponential; the rest is "<truncated>".
nlohmann::json pickle_to_json(const PickleValue& v);

// args.<key> as an integer, when it is one.
bool megatron_int_arg(const PickleValue& args, const char* key, std::int64_t& out);

}  // namespace dlm::ckpt::detail
