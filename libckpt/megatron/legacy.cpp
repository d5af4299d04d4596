// Megatron's legacy checkpoints (megatron.h): find the rank files, map names, merge TP shards, stack
// PP stages.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "dlm/ckpt/megatron.h"
#include "dlm/ckpt/torch_file.h"
#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "megatron_args.h"
#include "optimizer_state.h"

namespace dlm::ckpt {

namespace fs = std::filesystem;
using Kind = PickleValue::Kind;

namespace {

constexpr const char* kTracker = "latest_checkpointed_iteration.txt";
constexpr const char* kRankFile = "model_optim_rng.pt";

// mp_rank_TT or mp_rank_TT_PPP -> (tp, pp); false for any other name.
bool parse_rank_dir(const std::string& name, int& tp, int& pp) {
  unsigned t = 0, p = 0;
  char tail = 0;
  if (std::sscanf(name.c_str(), "mp_rank_%2u_%3u%c", &t, &p, &tail) == 2 && name.size() == 14) {
    tp = static_cast<int>(t), pp = static_cast<int>(p);
    return true;
  }
  if (std::sscanf(name.c_str(), "mp_rank_%2u%c", &t, &tail) == 1 && name.size() == 10) {
    tp = static_cast<int>(t), pp = 0;
    return true;
  }
  return false;
}

}  // namespace

std::string detail::megatron_iteration_dir(const std::string& path) {
  const fs::path tracker = fs::path(path) / kTracker;
  if (!fs::exists(tracker)) return path;
  std::string text = read_text_file(tracker.string());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text == "release") return (fs::path(path) / "release").string();
  std::int64_t it = -1;
  try {
    std::size_t used = 0;
    it = std::stoll(text, &used);
    if (used != text.size()) it = -1;
  } catch (const std::exception&) {
  }
  if (it < 0) fail_at(tracker.string(), fmt::format("expected an iteration number or 'release', found '{}'", text));
  return (fs::path(path) / fmt::format("iter_{:07d}", it)).string();
}

std::string detail::megatron_to_dlm_name(const std::string& local, int layer_offset, const std::string& file) {
  if (local == "_metadata" || local.ends_with("._extra_state") || local.ends_with(".inv_freq")) return "";
  std::string name = local;
  const std::string layers = "decoder.layers.";
  if (name.starts_with(layers)) {
    const std::size_t dot = name.find('.', layers.size());
    int n = -1;
    try {
      n = std::stoi(name.substr(layers.size(), dot - layers.size()));
    } catch (const std::exception&) {
    }
    if (dot == std::string::npos || n < 0) fail_at(file, fmt::format("tensor '{}' has no layer number", local));
    std::string rest = name.substr(dot + 1);
    if (rest == "input_layernorm.weight") rest = "self_attention.linear_qkv.layer_norm_weight";
    if (rest == "pre_mlp_layernorm.weight") rest = "mlp.linear_fc1.layer_norm_weight";
    name = fmt::format("{}{}.{}", layers, n + layer_offset, rest);
  }
  return name;
}

namespace {

int layer_count(const PickleValue& model) {
  std::set<std::string> layers;
  for (const auto& [k, v] : model.entries)
    if (k->is(Kind::kString) && k->s.starts_with("decoder.layers.")) layers.insert(k->s.substr(0, k->s.find('.', 15)));
  return static_cast<int>(layers.size());
}

// Concatenates 2-D shards along `dim`.
Tensor concat(const std::vector<Tensor>& shards, int dim) {
  const std::int64_t rows = shards[0].shape[0], cols = shards[0].shape[1];
  Tensor out = Tensor::zeros("", dim == 0 ? std::vector<std::int64_t>{rows * static_cast<std::int64_t>(shards.size()), cols}
                                           : std::vector<std::int64_t>{rows, cols * static_cast<std::int64_t>(shards.size())});
  std::int64_t at = 0;
  for (const Tensor& s : shards) {
    const auto src = s.f32();
    auto dst = out.f32();
    if (dim == 0) std::copy(src.begin(), src.end(), dst.begin() + at * cols);
    else
      for (std::int64_t r = 0; r < rows; ++r) std::copy(src.begin() + r * cols, src.begin() + (r + 1) * cols, dst.begin() + r * out.shape[1] + at);
    at += dim == 0 ? rows : cols;
  }
  return out;
}

// SwiGLU's fc1: rank r holds [gate_r ; up_r]; the global tensor is [gate_0..gate_T-1 ; up_0..up_T-1].
Tensor merge_glu(const std::vector<Tensor>& shards) {
  std::vector<Tensor> gates, ups;
  for (const Tensor& s : shards) {
    const std::int64_t half = s.shape[0] / 2, cols = s.shape[1];
    Tensor g = Tensor::zeros("", {half, cols}), u = Tensor::zeros("", {half, cols});
    std::copy(s.f32().begin(), s.f32().begin() + half * cols, g.f32().begin());
    std::copy(s.f32().begin() + half * cols, s.f32().end(), u.f32().begin());
    gates.push_back(std::move(g));
    ups.push_back(std::move(u));
  }
  return concat({concat(gates, 0), concat(ups, 0)}, 0);
}

}  // namespace

Tensor detail::merge_megatron_tp(const std::string& name, std::vector<Tensor> shards, const std::string& where) {
  for (const Tensor& s : shards)
    if (s.shape != shards[0].shape) fail_at(where, fmt::format("tensor '{}' has different shapes on different TP ranks", name));
  if (shards.size() == 1 || shards[0].shape.size() == 1) return std::move(shards[0]);  // replicated (norms)
  if (shards[0].shape.size() != 2) fail_at(where, fmt::format("tensor '{}' is neither 1-D nor 2-D", name));
  if (name.ends_with("mlp.linear_fc1.weight")) {
    if (shards[0].shape[0] % 2) fail_at(where, fmt::format("tensor '{}' has an odd number of rows; SwiGLU needs gate and up halves", name));
    return merge_glu(shards);
  }
  if (name.ends_with("linear_proj.weight") || name.ends_with("linear_fc2.weight")) return concat(shards, 1);
  return concat(shards, 0);  // vocabulary rows, QKV groups
}

void detail::check_megatron_tensors(const TensorSet& tensors, const ModelConfig& config, const std::string& where) {
  std::set<std::string> known;
  for (const TensorSpec& spec : model_tensors(config)) {
    known.insert(spec.name);
    auto it = tensors.find(spec.name);
    if (it == tensors.end()) fail_at(where, fmt::format("Megatron checkpoint has no tensor for '{}'", spec.name));
    if (it->second.shape != spec.shape)
      fail_at(where, fmt::format("tensor '{}' merges to [{}], the args' model needs [{}]", spec.name, fmt::join(it->second.shape, ", "),
                                 fmt::join(spec.shape, ", ")));
  }
  for (const auto& entry : tensors)
    if (!known.count(entry.first)) fail_at(where, fmt::format("Megatron tensor '{}' has no place in dlm's model", entry.first));
}

bool is_megatron_legacy(const std::string& path) {
  if (fs::exists(fs::path(path) / kTracker)) return true;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    int tp = 0, pp = 0;
    if (parse_rank_dir(e.path().filename().string(), tp, pp)) return true;
  }
  return false;
}

MegatronCheckpoint load_megatron_legacy(const std::string& path) {
  const std::string dir = detail::megatron_iteration_dir(path);
  if (!fs::is_directory(dir)) fail_at(dir, "Megatron iteration folder is missing");
  std::map<std::pair<int, int>, std::string> rank_files;  // (pp, tp) -> file
  int tp = 0, pp = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    int t = 0, p = 0;
    if (!e.is_directory() || !parse_rank_dir(e.path().filename().string(), t, p)) continue;
    rank_files[{p, t}] = (e.path() / kRankFile).string();
    tp = std::max(tp, t + 1), pp = std::max(pp, p + 1);
  }
  if (rank_files.empty()) fail_at(dir, "no mp_rank_XX[_YYY] folders (expert-parallel and distributed-optimizer-only layouts are not read)");
  if (static_cast<int>(rank_files.size()) != tp * pp)
    fail_at(dir, fmt::format("{} mp_rank folders, expected TP {} x PP {} = {}", rank_files.size(), tp, pp, tp * pp));

  MegatronCheckpoint out;
  out.layout.tp = tp, out.layout.pp = pp;
  std::map<std::string, std::vector<Tensor>> shards;  // dlm name -> one per TP rank
  std::map<std::string, std::vector<Tensor>> masters, exp_avg, exp_avg_sq;  // the same, of the optimizer
  bool with_optimizer = false;
  int layer_offset = 0;
  std::vector<int> stage_sizes;
  for (int p = 0; p < pp; ++p) {
    int stage_layers = -1;
    for (int t = 0; t < tp; ++t) {
      const std::string& file = rank_files.at({p, t});
      if (!fs::is_regular_file(file)) fail_at(file, "rank file is missing");
      const TorchFile f(file);
      const PickleValue& root = f.root();
      if (root.get("model0")) fail_at(file, "virtual pipeline stages (model0, model1, ...) are not read");
      const PickleValue* model = root.get("model");
      if (!model || !model->is(Kind::kDict)) fail_at(file, "no 'model' state dict");
      if (p == 0 && t == 0) {
        const PickleValue* args = root.get("args");
        if (!args) fail_at(file, "no 'args' (checkpoints older than checkpoint_version 3 are not read)");
        out.config = detail::model_config_from_megatron_args(*args, tp, file);
        const PickleValue* it = root.get("iteration");
        out.state.iteration = it && it->is(Kind::kInt) ? it->i : 0;
        detail::megatron_int_arg(*args, "consumed_train_samples", out.state.consumed_samples);
        nlohmann::json extra = {{"source", fmt::format("megatron legacy {}", fs::path(dir).filename().string())},
                                {"megatron_args", detail::pickle_to_json(*args)}};
        out.state.args_json = extra.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      }
      const int layers = layer_count(*model);
      if (stage_layers >= 0 && layers != stage_layers) fail_at(file, "TP ranks of one pipeline stage hold different layers");
      stage_layers = layers;
      std::vector<detail::LocalParam> params;  // named_parameters order, for the optimizer state
      std::vector<std::string> names;          // dlm's name of each, "" for the tied output copy
      for (const auto& [k, v] : model->entries) {
        if (!k->is(Kind::kString)) fail_at(file, "model state dict has a key that is not a string");
        std::string name = detail::megatron_to_dlm_name(k->s, layer_offset, file);
        if (name.empty() || v->is(Kind::kNone)) continue;
        if (!v->is(Kind::kTensor)) fail_at(file, fmt::format("model entry '{}' is not a tensor", k->s));
        // Across pipeline stages a tied embedding and its last-stage copy get their own buffer bucket.
        const bool shared = pp > 1 && out.config.tie_word_embeddings &&
                            (name == "output_layer.weight" || name == "embedding.word_embeddings.weight");
        params.push_back({k->s, v->shape, shared});
        if (out.config.tie_word_embeddings && name == "output_layer.weight") name.clear();  // the last stage's copy
        names.push_back(name);
        if (name.empty()) continue;
        auto& list = shards[name];
        if (static_cast<int>(list.size()) != t) fail_at(file, fmt::format("tensor '{}' appears on more than one pipeline stage", k->s));
        list.push_back(f.tensor(*v, name));
      }
      const PickleValue* rank_args = root.get("args");
      if (!rank_args) fail_at(file, "no 'args'");
      const auto opt = detail::read_legacy_optimizer_state(f, params, *rank_args);
      if (p == 0 && t == 0) with_optimizer = opt.has_value();
      if (opt.has_value() != with_optimizer) fail_at(file, "some rank files carry optimizer state and others do not");
      if (!opt) continue;
      if (out.state.optimizer_steps && opt->steps != out.state.optimizer_steps)
        fail_at(file, fmt::format("optimizer step {} differs from the other ranks' {}", opt->steps, out.state.optimizer_steps));
      out.state.optimizer_steps = opt->steps;
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (names[i].empty()) continue;
        if (!opt->master.empty()) masters[names[i]].push_back(opt->master[i]);
        exp_avg[names[i]].push_back(opt->exp_avg[i]);
        exp_avg_sq[names[i]].push_back(opt->exp_avg_sq[i]);
      }
    }
    layer_offset += stage_layers;
    stage_sizes.push_back(stage_layers);
  }
  if (layer_offset != out.config.num_layers)
    fail_at(dir, fmt::format("the stages hold {} layers, args.num_layers is {}", layer_offset, out.config.num_layers));
  if (pp > 1) out.layout.layers_per_stage = stage_sizes;
  auto merge_all = [&](std::map<std::string, std::vector<Tensor>>& from, TensorSet& into) {
    for (auto& [name, list] : from) {
      if (static_cast<int>(list.size()) != tp) fail_at(dir, fmt::format("tensor '{}' is on {} of {} TP ranks", name, list.size(), tp));
      Tensor merged = detail::merge_megatron_tp(name, std::move(list), dir);
      merged.name = name;
      into[name] = std::move(merged);
    }
  };
  merge_all(shards, out.tensors);
  detail::check_megatron_tensors(out.tensors, out.config, dir);
  TensorSet master_set;
  merge_all(masters, master_set);
  merge_all(exp_avg, out.exp_avg);
  merge_all(exp_avg_sq, out.exp_avg_sq);
  detail::adopt_optimizer_state(out, std::move(master_set), dir);
  return out;
}

}  // namespace dlm::ckpt
