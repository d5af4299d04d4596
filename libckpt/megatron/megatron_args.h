// Megatron's run arguments (the pickled argparse.Namespace of a checkpoint) as dlm's model config and
// as JSON (libckpt internal).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/pickle.h"
#include "dlm/ckpt/tensor.h"

namespace dlm::ckpt::detail {

// The GPT shape args describe, for `tp` ranks. Refuses, naming the argument, a model dlm does not
// have (biases, MoE, LayerNorm, a non-gated MLP, learned position embeddings).
ModelConfig model_config_from_megatron_args(const PickleValue& args, int tp, const std::string& file);

// A pickled value as JSON: tensors become "<tensor float32 [4, 6]>", globals and objects their names.
// At most 1 Mi values-plus-string-bytes are written (values shared through the memo count each time
// they appear), so a pickle of nested shared lists cannot make it exponential; the rest is "<truncated>".
nlohmann::json pickle_to_json(const PickleValue& v);

// The iteration folder a Megatron root names through latest_checkpointed_iteration.txt (iter_XXXXXXX or
// release), or `path` itself when it has no such file.
std::string megatron_iteration_dir(const std::string& path);
// A Megatron state-dict name -> dlm's ("" for entries that are not weights): layer N becomes
// N + layer_offset, the local spec's norm names become TE's (megatron.h).
std::string megatron_to_dlm_name(const std::string& local, int layer_offset, const std::string& file);
// One tensor's TP shards merged into the global tensor (megatron.h: vocabulary rows and QKV groups along dim
// 0, row-parallel along dim 1, SwiGLU's [gate_r ; up_r] halves, 1-D tensors replicated).
Tensor merge_megatron_tp(const std::string& name, std::vector<Tensor> shards, const std::string& where);
// Every tensor of config's model present with its shape, and no other; errors name `where`.
void check_megatron_tensors(const TensorSet& tensors, const ModelConfig& config, const std::string& where);

// args.<key> as an integer, when it is one.
bool megatron_int_arg(const PickleValue& args, const char* key, std::int64_t& out);

}  // namespace dlm::ckpt::detail
