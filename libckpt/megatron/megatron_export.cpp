// save_megatron_torch_dist (megatron_export.h): the files megatron-core 0.16's torch_dist strategy
// writes (dist_checkpointing/strategies/torch.py through torch.distributed.checkpoint's
// FileSystemWriter), from one process.
#include "dlm/ckpt/megatron_export.h"

#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include <fmt/format.h>

#include "dlm/ckpt/torch_writer.h"
#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"

namespace dlm::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDcp = "torch.distributed.checkpoint.metadata";
constexpr const char* kDistcp = "__0_0.distcp";
// The linear layers whose `_extra_state` megatron-core's sharded_state_dict asks for, per layer.
constexpr const char* kExtraState[] = {"self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2"};

struct Chunk {
  std::vector<std::int64_t> offsets, sizes;
  std::span<const std::uint8_t> bytes;
};
struct ShardedTensor {
  std::string fqn;
  std::vector<std::int64_t> size;
  std::vector<Chunk> chunks;
};
// One item of the .distcp file: a chunk of a tensor (offsets) or an object (no offsets).
struct Stored {
  std::string fqn;
  std::optional<std::vector<std::int64_t>> offsets;
  std::uint64_t at = 0, length = 0;
};

struct Global {
  const char* module;
  const char* name;
};
using Arg = std::variant<std::nullptr_t, bool, std::int64_t, double, std::string, Global>;

void torch_size(PickleWriter& w, std::span<const std::int64_t> shape) { w.global("torch", "Size").mark().int_tuple(shape).tuple().reduce(); }

// A dataclass instance as pickle writes it: cls.__new__(cls), then BUILD with its __dict__; the caller
// writes the key/value pairs between the two.
void begin_object(PickleWriter& w, const char* module, const char* cls) { w.global(module, cls).empty_tuple().newobj().empty_dict().mark(); }
void end_object(PickleWriter& w) { w.setitems().build(); }

// TensorProperties' __getstate__ tuple: fp32, strided, no grad, contiguous, not pinned, strides None.
void fp32_properties(PickleWriter& w) {
  w.global(kDcp, "TensorProperties").empty_tuple().newobj();
  w.mark().global("torch", "float32");
  w.global("torch.serialization", "_get_layout").mark().string("torch.strided").tuple().reduce();
  w.boolean(false).global(kDcp, "_MEM_FORMAT_ENCODING").mark().integer(0).tuple().reduce();
  w.boolean(false).none().tuple().build();
}

std::string metadata_pickle(const std::vector<ShardedTensor>& tensors, const std::vector<std::string>& objects, const std::vector<Stored>& stored) {
  PickleWriter w;
  begin_object(w, kDcp, "Metadata");
  w.string("state_dict_metadata").empty_dict().mark();
  for (const std::string& fqn : objects) w.string(fqn).global(kDcp, "BytesStorageMetadata").empty_tuple().newobj();
  for (const ShardedTensor& t : tensors) {
    w.string(t.fqn);
    begin_object(w, kDcp, "TensorStorageMetadata");
    w.string("properties"), fp32_properties(w);
    w.string("size"), torch_size(w, t.size);
    w.string("chunks").empty_list().mark();
    for (const Chunk& c : t.chunks) {
      begin_object(w, kDcp, "ChunkStorageMetadata");
      w.string("offsets"), torch_size(w, c.offsets);
      w.string("sizes"), torch_size(w, c.sizes);
      end_object(w);
    }
    w.appends();
    end_object(w);
  }
  w.setitems();
  w.string("planner_data").none();
  w.string("storage_data").empty_dict().mark();
  for (const Stored& s : stored) {
    begin_object(w, kDcp, "MetadataIndex");
    w.string("fqn").string(s.fqn).string("index").none();
    if (s.offsets) w.string("offset"), torch_size(w, *s.offsets);
    end_object(w);
    begin_object(w, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
    w.string("relative_path").string(kDistcp).string("offset").integer(static_cast<std::int64_t>(s.at));
    w.string("length").integer(static_cast<std::int64_t>(s.length));
    end_object(w);
  }
  w.setitems();
  w.string("storage_meta").none().string("version").string("1.0.0");
  end_object(w);
  return w.finish();
}

std::vector<std::pair<std::string, Arg>> megatron_args(const ModelConfig& c, const TrainingState& state, const MegatronExportOptions& o,
                                                      std::int64_t divisible_by, std::int64_t padded) {
  using I = std::int64_t;
  const double base = c.rotary_base;
  std::vector<std::pair<std::string, Arg>> a = {
      {"num_layers", I{c.num_layers}}, {"hidden_size", I{c.hidden_size}}, {"ffn_hidden_size", I{c.ffn_hidden_size}},
      {"num_attention_heads", I{c.num_attention_heads}}, {"group_query_attention", c.num_query_groups != c.num_attention_heads},
      {"num_query_groups", I{c.num_query_groups}}, {"kv_channels", I{c.kv_channels}}, {"padded_vocab_size", padded},
      {"vocab_size", c.vocab_size}, {"make_vocab_size_divisible_by", divisible_by},
      {"max_position_embeddings", I{c.max_position_embeddings}}, {"seq_length", I{c.max_position_embeddings}},
      {"tensor_model_parallel_size", I{o.tp}}, {"pipeline_model_parallel_size", I{o.pp}},
      {"virtual_pipeline_model_parallel_size", nullptr}, {"swiglu", true}, {"normalization", std::string("RMSNorm")},
      {"norm_epsilon", c.norm_epsilon}, {"qk_layernorm", c.qk_layernorm}, {"add_bias_linear", false}, {"add_qkv_bias", false},
      {"untie_embeddings_and_output_weights", !c.tie_word_embeddings}, {"position_embedding_type", std::string("rope")},
      {"add_position_embedding", false},
      {"rotary_base", base == static_cast<double>(static_cast<I>(base)) ? Arg(static_cast<I>(base)) : Arg(base)},
      {"rotary_percent", 1.0}, {"init_method_std", c.init_method_std}, {"num_experts", nullptr},
      {"params_dtype", Global{"torch", "float32"}}, {"fp16", false}, {"bf16", false},
      {"attention_mask_type", std::string(c.attention_mask == AttentionMask::kBidirectional ? "no_mask" : "causal")},
      {"consumed_train_samples", state.consumed_samples}, {"skipped_train_samples", I{0}}, {"consumed_valid_samples", I{0}},
      {"world_size", I{o.tp} * o.pp}, {"data_parallel_size", I{1}}, {"ckpt_format", std::string("torch_dist")},
      // megatron/training's load_checkpoint then loads neither optimizer nor RNG state (none is written),
      // as with checkpoints Megatron's own converter writes.
      {"no_save_optim", true}, {"no_save_rng", true}};
  if (c.mask_token_id) a.emplace_back("mask_token_id", I{*c.mask_token_id});
  return a;
}

std::string common_pickle(const std::vector<std::pair<std::string, Arg>>& args, std::int64_t iteration) {
  PickleWriter w;
  w.empty_dict().mark().string("args");
  w.global("argparse", "Namespace").empty_tuple().newobj().empty_dict().mark();
  for (const auto& [key, value] : args) {
    w.string(key);
    std::visit([&w](const auto& v) {
      using T = std::decay_t<decltype(v)>;
      if constexpr (std::is_same_v<T, std::nullptr_t>) w.none();
      else if constexpr (std::is_same_v<T, bool>) w.boolean(v);
      else if constexpr (std::is_same_v<T, std::int64_t>) w.integer(v);
      else if constexpr (std::is_same_v<T, double>) w.real(v);
      else if constexpr (std::is_same_v<T, std::string>) w.string(v);
      else w.global(v.module, v.name);
    }, value);
  }
  w.setitems().build();
  w.string("iteration").integer(iteration).string("checkpoint_version").real(3.0).setitems();
  return w.finish();
}

void write_archive_file(const std::string& path, std::string_view pkl, std::string_view archive) {
  AtomicFile f(path);
  write_torch_archive(pkl, {}, [&f](std::span<const std::uint8_t> b) { f.write(b.data(), b.size()); }, archive);
  f.commit();
}

// The model's tensors as megatron-core's sharded state: layers stacked (one chunk per layer), the
// vocabulary rows padded to `padded`. Chunks point into `tensors` (or the re-padded copies).
struct ShardedModel {
  std::vector<ShardedTensor> tensors;
  std::deque<Tensor> repadded;
};

ShardedModel shard_model(const ModelConfig& c, const TensorSet& tensors, std::int64_t padded, const std::string& root) {
  auto refuse = [&root](bool bad, const std::string& what) {
    if (bad) fail_at(root, what);
  };
  ShardedModel out;
  std::vector<ShardedTensor>& sharded = out.tensors;
  std::map<std::string, std::size_t> stacks;  // decoder.layers.<rest> -> index into sharded
  for (const TensorSpec& spec : model_tensors(c)) {
    auto it = tensors.find(spec.name);
    refuse(it == tensors.end(), fmt::format("no tensor '{}' for the model", spec.name));
    const Tensor* t = &it->second;
    refuse(t->shape != spec.shape || t->dtype != TensorDType::kFloat32,
           fmt::format("tensor '{}' is [{}], the model needs fp32 [{}]", spec.name, fmt::join(t->shape, ", "), fmt::join(spec.shape, ", ")));
    const std::string layers = "decoder.layers.";
    if (!spec.name.starts_with(layers)) {
      if (spec.shape.size() == 2 && spec.shape[0] != padded) {  // vocabulary rows
        Tensor rows = Tensor::zeros(spec.name, {padded, spec.shape[1]});
        const std::size_t keep = static_cast<std::size_t>(std::min(padded, spec.shape[0]) * spec.shape[1]);
        std::copy(t->f32().begin(), t->f32().begin() + keep, rows.f32().begin());
        out.repadded.push_back(std::move(rows));
        t = &out.repadded.back();
      }
      sharded.push_back({spec.name, t->shape, {{std::vector<std::int64_t>(t->shape.size(), 0), t->shape, t->bytes}}});
      continue;
    }
    const std::size_t dot = spec.name.find('.', layers.size());
    const std::int64_t layer = std::stoll(spec.name.substr(layers.size(), dot - layers.size()));
    const std::string fqn = layers + spec.name.substr(dot + 1);
    auto [at, fresh] = stacks.try_emplace(fqn, sharded.size());
    std::vector<std::int64_t> size = {c.num_layers}, offsets = {layer}, sizes = {1};
    size.insert(size.end(), spec.shape.begin(), spec.shape.end());
    offsets.resize(size.size(), 0);
    sizes.insert(sizes.end(), spec.shape.begin(), spec.shape.end());
    if (fresh) sharded.push_back({fqn, size, {}});
    sharded[at->second].chunks.push_back({offsets, sizes, t->bytes});
  }
  std::set<std::string> known;
  for (const TensorSpec& spec : model_tensors(c)) known.insert(spec.name);
  for (const auto& entry : tensors) refuse(!known.count(entry.first), fmt::format("tensor '{}' has no place in a Megatron GPT model", entry.first));
  return out;
}

}  // namespace

std::string save_megatron_torch_dist(const std::string& root, const ModelConfig& config, const TensorSet& tensors,
                                     const TrainingState& state, const MegatronExportOptions& o) {
  const ModelConfig& c = config;
  auto refuse = [&root](bool bad, const std::string& what) {
    if (bad) fail_at(root, what);
  };
  refuse(o.tp < 1 || o.pp < 1, "tensor and pipeline parallel sizes must be positive");
  refuse(c.num_attention_heads % o.tp || c.num_query_groups % o.tp || c.ffn_hidden_size % o.tp,
         fmt::format("target TP {} must divide the attention heads ({}), query groups ({}) and ffn_hidden_size ({})", o.tp,
                     c.num_attention_heads, c.num_query_groups, c.ffn_hidden_size));
  refuse(c.num_layers % o.pp, fmt::format("target PP {} must divide num_layers {}", o.pp, c.num_layers));
  refuse(state.iteration < 0, "the iteration must not be negative");

  // Megatron pads the vocabulary to make_vocab_size_divisible_by * TP.
  const std::int64_t multiple = c.make_vocab_size_divisible_by;
  const std::int64_t divisible_by = multiple % o.tp == 0 ? multiple / o.tp : multiple;
  const std::int64_t step = divisible_by * o.tp;
  const std::int64_t padded = (c.vocab_size + step - 1) / step * step;

  const ShardedModel model = shard_model(c, tensors, padded, root);
  const std::vector<ShardedTensor>& sharded = model.tensors;
  std::vector<std::string> objects;
  for (int l = 0; l < c.num_layers; ++l)
    for (const char* m : kExtraState) objects.push_back(fmt::format("decoder.layers.{}._extra_state/shard_{}_{}", m, l, c.num_layers));

  fs::create_directories(root);
  const fs::path final_dir = fs::path(root) / fmt::format("iter_{:07d}", state.iteration);
  const fs::path temp_dir = fs::path(root) / fmt::format("iter_{:07d}.tmp", state.iteration);
  refuse(fs::exists(final_dir), fmt::format("{} exists already; expected a new iteration folder", final_dir.string()));
  fs::remove_all(temp_dir);
  fs::create_directories(temp_dir);

  std::vector<Stored> stored;
  {
    AtomicFile f((temp_dir / kDistcp).string());
    auto sink = [&f](std::span<const std::uint8_t> b) { f.write(b.data(), b.size()); };
    PickleWriter none_list;
    const std::string none_pkl = none_list.empty_list().mark().none().appends().finish();  // torch.save([None])
    for (const std::string& fqn : objects) stored.push_back({fqn, std::nullopt, f.size(), write_torch_archive(none_pkl, {}, sink)});
    for (const ShardedTensor& t : sharded)
      for (const Chunk& chunk : t.chunks) {
        PickleWriter w;
        pickle_float_tensor(w, "0", chunk.sizes);
        const TorchStorage storage{"0", chunk.bytes};
        stored.push_back({t.fqn, chunk.offsets, f.size(), write_torch_archive(w.finish(), {&storage, 1}, sink)});
      }
    f.commit();
  }
  {
    AtomicFile f((temp_dir / ".metadata").string());
    f.write(metadata_pickle(sharded, objects, stored));
    f.commit();
  }
  write_archive_file((temp_dir / "common.pt").string(), common_pickle(megatron_args(c, state, o, divisible_by, padded), state.iteration), "common");
  write_file_atomically((temp_dir / "metadata.json").string(),
                        R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1})");
  fsync_directory(temp_dir.string());
  fs::rename(temp_dir, final_dir);
  fsync_directory(root);
  write_file_atomically((fs::path(root) / "latest_checkpointed_iteration.txt").string(), std::to_string(state.iteration));
  return final_dir.string();
}

}  // namespace dlm::ckpt
