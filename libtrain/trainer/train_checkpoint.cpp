#include "dlm/train/train_checkpoint.h"

#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "dlm/ckpt/safetensors.h"
#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"

namespace dlm::train {
namespace {

std::string iteration_dir(const std::string& save, std::int64_t iteration) {
  return fmt::format("{}/iter_{:07}", save, iteration);
}

ckpt::TensorView view_of(const std::string& name, std::span<const float> values, std::vector<std::int64_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<std::int64_t>(values.size())};
  if (ckpt::element_count(shape) != static_cast<std::int64_t>(values.size()))
    fail(fmt::format("checkpoint: tensor {} has {} values for its shape", name, values.size()));
  return {name, ckpt::TensorDType::kFloat32, std::move(shape),
          {reinterpret_cast<const std::uint8_t*>(values.data()), values.size_bytes()}};
}

std::int64_t metadata_int(const ckpt::SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) fail_at(f.path(), fmt::format("metadata has no \"{}\"", key));
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    fail_at(f.path(), fmt::format("metadata \"{}\" is '{}', expected an integer", key, it->second));
  }
}

void copy_fp32(const ckpt::TensorView& v, std::span<float> out, const std::string& file) {
  if (v.dtype != ckpt::TensorDType::kFloat32 || v.bytes.size() != out.size_bytes())
    fail_at(file, fmt::format("tensor {}: expected {} fp32 values, found {} bytes of {}", v.name, out.size(),
                              v.bytes.size(), ckpt::dtype_name(v.dtype)));
  std::memcpy(out.data(), v.bytes.data(), v.bytes.size());
}

}  // namespace

void save_train_checkpoint(const std::string& save_dir, const ckpt::ModelConfig& config,
                           std::span<const ParamRef> params, const AdamW& optimizer, const TrainProgress& progress,
                           const std::map<std::string, std::string>& extra_metadata) {
  const std::string dir = iteration_dir(save_dir, progress.iteration);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail_at(dir, fmt::format("cannot create the checkpoint folder: {}", ec.message()));
  std::vector<ckpt::TensorView> weights, moments;
  for (const auto& p : params) weights.push_back(view_of(p.name, p.value, p.shape));
  for (std::size_t t = 0; t < optimizer.exp_avg().size() && t < params.size(); ++t) {
    moments.push_back(view_of("exp_avg." + params[t].name, optimizer.exp_avg()[t], params[t].shape));
    moments.push_back(view_of("exp_avg_sq." + params[t].name, optimizer.exp_avg_sq()[t], params[t].shape));
  }
  ckpt::SafetensorsMetadata meta(extra_metadata.begin(), extra_metadata.end());
  meta["model_config"] = ckpt::model_config_to_json(config);
  meta["iteration"] = std::to_string(progress.iteration);
  meta["consumed_samples"] = std::to_string(progress.consumed_samples);
  meta["adam_steps"] = std::to_string(optimizer.steps());
  ckpt::write_safetensors(dir + "/optimizer.safetensors", moments, {{"adam_steps", meta["adam_steps"]}});
  ckpt::write_safetensors(dir + "/model.safetensors", weights, meta);
  fsync_directory(dir);
  write_file_atomically(save_dir + "/latest_checkpointed_iteration.txt", std::to_string(progress.iteration) + "\n");
}

TrainCheckpoint load_train_checkpoint(const std::string& load_dir, std::span<const ParamRef> params,
                                      const AdamWOptions& adam) {
  TrainCheckpoint c;
  const std::string tracker = load_dir + "/latest_checkpointed_iteration.txt";
  if (std::filesystem::exists(tracker)) {
    const std::string text = read_text_file(tracker);
    std::int64_t iteration = 0;
    try {
      iteration = std::stoll(text);
    } catch (const std::exception&) {
      fail_at_line(tracker, 1, fmt::format("'{}' is not an iteration number", text));
    }
    c.dir = iteration_dir(load_dir, iteration);
  } else if (std::filesystem::exists(load_dir + "/model.safetensors")) {
    c.dir = load_dir;
  } else {
    fail_at(load_dir, "not a dlm checkpoint: no latest_checkpointed_iteration.txt and no model.safetensors");
  }
  ckpt::SafetensorsFile model(c.dir + "/model.safetensors");
  ckpt::SafetensorsFile moments(c.dir + "/optimizer.safetensors");
  c.metadata = model.metadata();
  auto cfg = c.metadata.find("model_config");
  if (cfg == c.metadata.end()) fail_at(model.path(), "metadata has no \"model_config\"");
  c.config = ckpt::model_config_from_json(cfg->second, model.path());
  c.progress.iteration = metadata_int(model, "iteration");
  c.progress.consumed_samples = metadata_int(model, "consumed_samples");
  for (const auto& v : model.tensors()) c.weights.emplace(v.name, ckpt::Tensor::copy_of(v));
  c.optimizer = AdamW(adam);
  const auto steps = metadata_int(model, "adam_steps");
  c.optimizer.set_steps(steps);
  if (steps > 0) {
    for (const auto& p : params) {
      for (const char* kind : {"exp_avg.", "exp_avg_sq."}) {
        const auto* v = moments.find(kind + p.name);
        if (!v) fail_at(moments.path(), fmt::format("no tensor {}{}", kind, p.name));
        auto& dst = std::string_view(kind) == "exp_avg." ? c.optimizer.exp_avg() : c.optimizer.exp_avg_sq();
        dst.emplace_back(p.value.size());
        copy_fp32(*v, dst.back(), moments.path());
      }
    }
  }
  return c;
}

void restore_weights(const TrainCheckpoint& c, std::span<const ParamRef> params) {
  const std::string file = c.dir + "/model.safetensors";
  for (const auto& p : params) {
    auto it = c.weights.find(p.name);
    if (it == c.weights.end()) fail_at(file, fmt::format("no tensor {}", p.name));
    copy_fp32(it->second.view(), p.value, file);
  }
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
