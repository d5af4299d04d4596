#include "dlm/train/train_checkpoint.h"

#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dlm/ckpt/checkpoint.h"
#include "dlm/common/error.h"

namespace dlm::train {
namespace {

void copy_fp32(const ckpt::TensorSet& set, const std::string& name, std::span<float> out, const std::string& file) {
  auto it = set.find(name);
  if (it == set.end()) fail_at(file, fmt::format("no tensor {}", name));
  const auto& t = it->second;
  if (t.dtype != ckpt::TensorDType::kFloat32 || t.bytes.size() != out.size_bytes())
    fail_at(file, fmt::format("tensor {}: expected {} fp32 values, found {} bytes", name, out.size(), t.bytes.size()));
  std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
}

}  // namespace

ckpt::TrainingState training_state(std::int64_t optimizer_steps, const TrainProgress& progress,
                                   const std::map<std::string, std::string>& extra_metadata) {
  ckpt::TrainingState state;
  state.iteration = progress.iteration;
  state.consumed_samples = progress.consumed_samples;
  state.optimizer_steps = optimizer_steps;
  state.args_json = nlohmann::json(extra_metadata).dump();
  return state;
}

StateViews state_views(std::span<const ParamRef> params, const AdamW& optimizer) {
  StateViews s;
  s.params.assign(params.begin(), params.end());
  for (std::size_t t = 0; t < params.size() && t < optimizer.exp_avg().size(); ++t) {
    s.exp_avg.emplace_back(optimizer.exp_avg()[t]);
    s.exp_avg_sq.emplace_back(optimizer.exp_avg_sq()[t]);
  }
  s.optimizer_steps = optimizer.steps();
  return s;
}

void write_rank_shards(ckpt::CheckpointWriter& writer, const ckpt::ModelConfig& config, const StateViews& state,
                       const CheckpointPlacement& placement) {
  std::map<std::string, std::size_t> index;
  for (std::size_t t = 0; t < state.params.size(); ++t) index[state.params[t].name] = t;
  const bool moments = !state.exp_avg.empty();
  for (int stage : placement.stages) {
    ckpt::TrainingViews local;
    for (const auto& shard : ckpt::rank_shards(config, placement.layout, placement.tensor_rank, stage, placement.expert_rank)) {
      if (!shard.saved) continue;
      auto it = index.find(shard.name);
      if (it == index.end()) fail(fmt::format("checkpoint save: this rank holds no tensor {} of stage {}", shard.name, stage));
      const std::size_t t = it->second;
      const auto numel = static_cast<std::size_t>(ckpt::element_count(shard.local_shape));
      const auto check = [&](std::span<const float> values) {
        if (values.size() != numel)
          fail(fmt::format("checkpoint: tensor {} has {} values for its shard of {}", shard.name, values.size(), numel));
        return values.data();
      };
      local.params[shard.name] = check(state.params[t].value);
      if (moments && t < state.exp_avg.size()) {
        local.exp_avg[shard.name] = check(state.exp_avg[t]);
        local.exp_avg_sq[shard.name] = check(state.exp_avg_sq[t]);
      }
    }
    writer.write_rank(placement.tensor_rank, stage, local, placement.expert_rank);
  }
}

void save_train_checkpoint(const std::string& save_dir, const ckpt::ModelConfig& config,
                           std::span<const ParamRef> params, const AdamW& optimizer, const TrainProgress& progress,
                           const std::map<std::string, std::string>& extra_metadata) {
  static const CheckpointPlacement whole_model;
  ckpt::CheckpointWriter writer(save_dir, progress.iteration, config, whole_model.layout);
  writer.begin();
  try {  // a failed save (a full disk) leaves no temp folder behind
    write_rank_shards(writer, config, state_views(params, optimizer), whole_model);
    writer.commit(training_state(optimizer.steps(), progress, extra_metadata));
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(writer.temp_dir(), ec);
    throw;
  }
}

void save_train_checkpoint_sharded(const std::string& save_dir, const ckpt::ModelConfig& config,
                                   std::span<const ParamRef> params, const AdamW& optimizer,
                                   const TrainProgress& progress, const CheckpointPlacement& placement,
                                   Communicator& world, bool writes,
                                   const std::map<std::string, std::string>& extra_metadata) {
  ckpt::CheckpointWriter writer(save_dir, progress.iteration, config, placement.layout);
  // Rank 0 opens the temporary folder before anyone writes, and commits after everyone wrote; a rank
  // that fails to write stops the others at the barrier's timeout with its rank named.
  if (world.rank() == 0) writer.begin();
  world.barrier();
  if (writes) write_rank_shards(writer, config, state_views(params, optimizer), placement);
  world.barrier();
  if (world.rank() == 0) writer.commit(training_state(optimizer.steps(), progress, extra_metadata));
  world.barrier();
}

std::string newest_checkpoint_root(const std::string& load_dir, const std::string& non_persistent_dir) {
  const auto latest = [](const std::string& root) -> std::int64_t {
    if (root.empty() || !std::filesystem::exists(std::filesystem::path(root) / "latest")) return -1;
    return ckpt::CheckpointReader(root).metadata().state.iteration;
  };
  const std::int64_t persistent = latest(load_dir), non_persistent = latest(non_persistent_dir);
  if (non_persistent >= 0 && non_persistent >= persistent) return non_persistent_dir;
  return persistent >= 0 ? load_dir : std::string();
}

TrainCheckpoint load_train_checkpoint(const std::string& load_dir, std::span<const ParamRef> params,
                                      const AdamWOptions& adam) {
  static const CheckpointPlacement whole_model;
  return load_train_checkpoint(load_dir, params, adam, whole_model);
}

TrainCheckpoint load_train_checkpoint(const std::string& load_dir, std::span<const ParamRef> params,
                                      const AdamWOptions& adam, const CheckpointPlacement& placement) {
  ckpt::CheckpointReader reader(load_dir);
  const auto& md = reader.metadata();
  TrainCheckpoint c;
  c.dir = reader.dir();
  c.config = md.config;
  c.progress.iteration = md.state.iteration;
  c.progress.consumed_samples = md.state.consumed_samples;
  if (!md.state.args_json.empty()) {
    auto j = nlohmann::json::parse(md.state.args_json, nullptr, false);
    if (j.is_object())
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it->is_string()) c.metadata[it.key()] = it->get<std::string>();
  }
  const bool with_optimizer = md.state.optimizer_steps > 0;
  ckpt::TrainingTensors tensors;
  for (int stage : placement.stages) {
    auto part = reader.read_rank(placement.layout, placement.tensor_rank, stage, with_optimizer, placement.expert_rank);
    tensors.params.merge(part.params);
    tensors.exp_avg.merge(part.exp_avg);
    tensors.exp_avg_sq.merge(part.exp_avg_sq);
  }
  c.weights = std::move(tensors.params);
  c.optimizer = AdamW(adam);
  c.optimizer.set_steps(md.state.optimizer_steps);
  const std::string file = c.dir + "/metadata.json";
  if (with_optimizer) {
    for (const auto& p : params) {
      c.optimizer.exp_avg().emplace_back(p.value.size());
      copy_fp32(tensors.exp_avg, p.name, c.optimizer.exp_avg().back(), file);
      c.optimizer.exp_avg_sq().emplace_back(p.value.size());
      copy_fp32(tensors.exp_avg_sq, p.name, c.optimizer.exp_avg_sq().back(), file);
    }
  }
  return c;
}

void restore_weights(const TrainCheckpoint& c, std::span<const ParamRef> params) {
  for (const auto& p : params) copy_fp32(c.weights, p.name, p.value, c.dir + "/metadata.json");
}

void check_config_matches(const ckpt::ModelConfig& f, const ckpt::ModelConfig& c, const std::string& file) {
  auto same = [&](const char* flag, auto a, auto b) {
    if (a != b) fail_at(file, fmt::format("the checkpoint has {} {}, the flags say {}", flag, b, a));
  };
  same("--num-layers", f.num_layers, c.num_layers);
  same("--hidden-size", f.hidden_size, c.hidden_size);
  same("--ffn-hidden-size", f.ffn_hidden_size, c.ffn_hidden_size);
  same("--num-attention-heads", f.num_attention_heads, c.num_attention_heads);
  same("--num-query-groups", f.num_query_groups, c.num_query_groups);
  same("--kv-channels", f.kv_channels, c.kv_channels);
  same("padded vocabulary", f.padded_vocab_size(), c.padded_vocab_size());
  same("--qk-layernorm", f.qk_layernorm, c.qk_layernorm);
  same("tied embeddings", f.tie_word_embeddings, c.tie_word_embeddings);
  same("--rotary-base", f.rotary_base, c.rotary_base);
  same("--norm-epsilon", f.norm_epsilon, c.norm_epsilon);
  same("--max-position-embeddings", f.max_position_embeddings, c.max_position_embeddings);
  same("attention mask (no_mask=0, causal=1)", static_cast<int>(f.attention_mask), static_cast<int>(c.attention_mask));
}

}  // namespace dlm::train
