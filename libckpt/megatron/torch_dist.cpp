// Megatron's torch_dist checkpoints (megatron.h): torch.distributed.checkpoint's .metadata pickle says
// where each chunk of each global tensor lies; each chunk is a torch.save archive inside a .distcp file.
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "dlm/ckpt/megatron.h"
#include "dlm/ckpt/torch_file.h"
#include "dlm/common/error.h"
#include "dlm/common/mapped_file.h"
#include "megatron_args.h"
#include "optimizer_state.h"

namespace dlm::ckpt {

namespace fs = std::filesystem;
using Kind = PickleValue::Kind;

namespace {

// A dataclass field of a pickled object (its BUILD state is the instance __dict__).
const PickleValue& field(const PickleValue& obj, const char* name, const std::string& file) {
  const PickleValue* v = obj.is(Kind::kObject) && obj.state ? obj.state->get(name) : nullptr;
  if (!v) fail_at(file, fmt::format("{} has no field '{}'", obj.is(Kind::kObject) ? obj.s : "value", name));
  return *v;
}

std::vector<std::int64_t> int_tuple(const PickleValue& v, const std::string& file) {
  if (!v.is(Kind::kTuple) && !v.is(Kind::kList)) fail_at(file, "expected a tuple of integers");
  std::vector<std::int64_t> out;
  for (const PickleValue* x : v.items) {
    if (!x->is(Kind::kInt) || x->i < 0) fail_at(file, "expected a tuple of non-negative integers");
    out.push_back(x->i);
  }
  return out;
}

struct Where {
  std::string file;
  std::uint64_t offset = 0, length = 0;
};

// Copies `chunk` (shape `sizes`) into `global` at `offsets`, row by row of the last dimension.
void place(Tensor& global, const Tensor& chunk, const std::vector<std::int64_t>& offsets, const std::string& where) {
  const std::size_t rank = global.shape.size();
  if (chunk.shape.size() != rank || offsets.size() != rank) fail_at(where, "chunk rank differs from its tensor's");
  for (std::size_t d = 0; d < rank; ++d)
    if (offsets[d] + chunk.shape[d] > global.shape[d]) fail_at(where, "chunk lies outside its tensor");
  if (chunk.numel() == 0) return;
  const std::int64_t row = rank ? chunk.shape[rank - 1] : 1;
  std::vector<std::int64_t> index(rank, 0);
  for (std::int64_t at = 0; at < chunk.numel(); at += row) {
    std::int64_t dst = 0;
    for (std::size_t d = 0; d < rank; ++d) dst = dst * global.shape[d] + offsets[d] + index[d];
    std::copy(chunk.f32().begin() + at, chunk.f32().begin() + at + row, global.f32().begin() + dst);
    for (std::size_t d = rank >= 1 ? rank - 1 : 0; d-- > 0;) {
      if (++index[d] < chunk.shape[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

bool is_megatron_torch_dist(const std::string& path) {
  const fs::path dir = detail::megatron_iteration_dir(path);
  return fs::exists(dir / ".metadata") && fs::exists(dir / "common.pt");
}

MegatronCheckpoint load_megatron_torch_dist(const std::string& path) {
  const std::string dir = detail::megatron_iteration_dir(path);
  MegatronCheckpoint out;
  const std::string common_path = (fs::path(dir) / "common.pt").string();
  const TorchFile common(common_path);
  const PickleValue* args = common.root().get("args");
  if (!args) fail_at(common_path, "no 'args'");
  std::int64_t tp = 1, pp = 1;
  detail::megatron_int_arg(*args, "tensor_model_parallel_size", tp);
  detail::megatron_int_arg(*args, "pipeline_model_parallel_size", pp);
  out.layout.tp = static_cast<int>(tp), out.layout.pp = static_cast<int>(pp);
  out.config = detail::model_config_from_megatron_args(*args, static_cast<int>(tp), common_path);
  const PickleValue* it = common.root().get("iteration");
  out.state.iteration = it && it->is(Kind::kInt) ? it->i : 0;
  detail::megatron_int_arg(*args, "consumed_train_samples", out.state.consumed_samples);
  out.state.args_json = nlohmann::json{{"source", fmt::format("megatron torch_dist {}", fs::path(dir).filename().string())},
                                       {"megatron_args", detail::pickle_to_json(*args)}}
                            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);

  const std::string meta_path = (fs::path(dir) / ".metadata").string();
  const MappedFile meta_file(meta_path);
  const Pickle meta = unpickle(meta_file.bytes(), meta_path);
  if (!meta.root().is(Kind::kObject) || meta.root().s != "torch.distributed.checkpoint.metadata.Metadata")
    fail_at(meta_path, "not a torch.distributed.checkpoint Metadata");
  // (fqn, chunk offsets) -> where its bytes lie.
  std::map<std::pair<std::string, std::vector<std::int64_t>>, Where> storage;
  const PickleValue& storage_data = field(meta.root(), "storage_data", meta_path);
  for (const auto& [k, v] : storage_data.entries) {
    const PickleValue& fqn = field(*k, "fqn", meta_path);
    const PickleValue* offset = k->is(Kind::kObject) && k->state ? k->state->get("offset") : nullptr;  // absent: None
    const PickleValue& file = field(*v, "relative_path", meta_path);
    const PickleValue& at = field(*v, "offset", meta_path);
    const PickleValue& length = field(*v, "length", meta_path);
    if (!fqn.is(Kind::kString) || !file.is(Kind::kString) || !at.is(Kind::kInt) || !length.is(Kind::kInt) || at.i < 0 || length.i < 0)
      fail_at(meta_path, "storage entry with a bad name, file, offset or length");
    if (file.s.find('/') != std::string::npos || file.s.starts_with(".")) fail_at(meta_path, fmt::format("storage file '{}' is not a plain name", file.s));
    storage[{fqn.s, !offset || offset->is(Kind::kNone) ? std::vector<std::int64_t>{} : int_tuple(*offset, meta_path)}] =
        {file.s, static_cast<std::uint64_t>(at.i), static_cast<std::uint64_t>(length.i)};
  }

  std::map<std::string, std::unique_ptr<MappedFile>> files;
  TensorSet masters;  // the optimizer's fp32 copies of the weights
  detail::DpReshardableState dp_state;  // the distributed optimizer's bucket-space state (dp_reshardable)
  std::int64_t dp_steps = -1;
  const PickleValue& tensors = field(meta.root(), "state_dict_metadata", meta_path);
  for (const auto& [k, v] : tensors.entries) {
    if (!k->is(Kind::kString)) fail_at(meta_path, "state_dict_metadata key is not a string");
    const std::string& fqn = k->s;
    // An item's bytes (a torch.save archive) inside its .distcp file.
    auto item_at = [&](const std::vector<std::int64_t>& offsets) {
      auto s = storage.find({fqn, offsets});
      if (s == storage.end()) fail_at(meta_path, fmt::format("no storage entry for a chunk of '{}'", fqn));
      auto& mapped = files[s->second.file];
      if (!mapped) mapped = std::make_unique<MappedFile>((fs::path(dir) / s->second.file).string());
      const Where& w = s->second;
      if (w.offset > mapped->size() || w.length > mapped->size() - w.offset)
        fail_at_offset(mapped->path(), w.offset, fmt::format("chunk of '{}' runs past the end of the file", fqn));
      return std::make_unique<TorchFile>(mapped->bytes().subspan(w.offset, w.length), fmt::format("{}@{}", mapped->path(), w.offset));
    };
    if (!v->is(Kind::kObject) || v->s != "torch.distributed.checkpoint.metadata.TensorStorageMetadata") {  // bytes
      if (fqn.starts_with("optimizer.distributed.dp_group_idx_0.optimizer/shard_")) dp_steps = detail::dp_reshardable_steps(*item_at({}));
      continue;
    }
    if (fqn.find("._extra_state") != std::string::npos) continue;
    std::string model_key = fqn, dp_slot;
    const std::string slot = detail::torch_dist_optimizer_slot(fqn, model_key);
    int dp_group = 0, dp_bucket = 0;
    const bool bucket_space = detail::dp_reshardable_key(fqn, dp_group, dp_bucket, dp_slot, meta_path);
    if (fqn.starts_with("optimizer.") && slot.empty() && !bucket_space)
      fail_at(meta_path, fmt::format("optimizer tensor '{}' cannot be mapped onto dlm's parameters", fqn));
    TensorSet& into = slot == "param" ? masters : slot == "exp_avg" ? out.exp_avg : slot == "exp_avg_sq" ? out.exp_avg_sq : out.tensors;
    Tensor global = Tensor::zeros(fqn, int_tuple(field(*v, "size", meta_path), meta_path));
    for (const PickleValue* chunk : field(*v, "chunks", meta_path).items) {
      const auto offsets = int_tuple(field(*chunk, "offsets", meta_path), meta_path);
      const auto item = item_at(offsets);
      const Tensor t = item->tensor(item->root(), fqn);
      if (t.shape != int_tuple(field(*chunk, "sizes", meta_path), meta_path)) fail_at(item->path(), fmt::format("chunk of '{}' has the wrong shape", fqn));
      place(global, t, offsets, item->path());
      if (bucket_space && offsets.size() == 1) dp_state[{dp_group, dp_bucket}].chunk_starts.insert(offsets[0]);
    }
    if (bucket_space) {
      if (global.shape.size() != 1) fail_at(meta_path, fmt::format("'{}' is not a flat bucket tensor", fqn));
      dp_state[{dp_group, dp_bucket}].slots[dp_slot] = std::move(global);
      continue;
    }
    // Layers are stacked along a leading dimension: decoder.layers.<rest> is [num_layers, ...].
    const std::string layers = "decoder.layers.";
    if (model_key.starts_with(layers) && !std::isdigit(static_cast<unsigned char>(model_key[layers.size()]))) {
      const std::int64_t n = global.shape.empty() ? 0 : global.shape[0];
      const std::vector<std::int64_t> shape(global.shape.begin() + 1, global.shape.end());
      const std::int64_t per = element_count(shape);
      for (std::int64_t l = 0; l < n; ++l) {
        const std::string name = detail::megatron_to_dlm_name(fmt::format("{}{}.{}", layers, l, model_key.substr(layers.size())), 0, meta_path);
        Tensor one = Tensor::zeros(name, shape);
        std::copy(global.f32().begin() + l * per, global.f32().begin() + (l + 1) * per, one.f32().begin());
        into[name] = std::move(one);
      }
      continue;
    }
    const std::string name = detail::megatron_to_dlm_name(model_key, 0, meta_path);
    if (name.empty() || (out.config.tie_word_embeddings && name == "output_layer.weight")) continue;
    global.name = name;
    into[name] = std::move(global);
  }
  detail::check_megatron_tensors(out.tensors, out.config, dir);
  if (!dp_state.empty()) {
    for (const auto& [key, bucket] : dp_state)
      if (bucket.slots.size() != 3)
        fail_at(meta_path, fmt::format("optimizer.distributed.dp_group_idx_{} bucket {}: param, exp_avg and exp_avg_sq are not all saved", key.first, key.second));
    if (!out.exp_avg.empty() || !masters.empty()) fail_at(meta_path, "both model-space and bucket-space optimizer state");
    detail::read_dp_reshardable(dp_state, out.config, out.layout, *args, meta_path, masters, out.exp_avg, out.exp_avg_sq);
    if (dp_steps <= 0) fail_at(meta_path, "no optimizer.distributed.dp_group_idx_0.optimizer object with the Adam step");
    out.state.optimizer_steps = dp_steps;
  } else if (!out.exp_avg.empty() || !masters.empty()) {
    const std::int64_t steps = detail::torch_dist_optimizer_steps(common);
    if (steps <= 0) fail_at(common_path, "optimizer tensors are saved, but common.pt's 'optimizer' has no step");
    out.state.optimizer_steps = steps;
  }
  detail::adopt_optimizer_state(out, std::move(masters), dir);
  return out;
}

MegatronCheckpoint load_megatron(const std::string& path) {
  return is_megatron_torch_dist(path) ? load_megatron_torch_dist(path) : load_megatron_legacy(path);
}

}  // namespace dlm::ckpt
