// Megatron's Adam state onto dlm's parameters (optimizer_state.h). Three layouts:
//   - the non-distributed optimizer in model_optim_rng.pt: torch's Adam state dict, keyed by the index
//     of each parameter in its param group (groups as megatron-core's _get_param_groups builds them:
//     weight-decayed 2-D tensors first, then wd_mult 0 for 1-D ones, each in named_parameters order),
//     and under Float16OptimizerWithFloat16Params the fp32 masters in 'fp32_from_fp16_params' per group;
//   - the distributed optimizer's distrib_optim.pt (gathered on DP rank 0 by save_parameter_state): per
//     grad buffer and dtype one fp32 'param', 'exp_avg', 'exp_avg_sq' over the buffer's elements with the
//     padding at each bucket's end removed; the positions are _ParamAndGradBuffer's, recomputed here;
//   - torch_dist, model space (non-distributed, fully_reshardable): optimizer.state.<slot>.<model key>,
//     read beside the weights;
//   - torch_dist dp_reshardable: the distributed optimizer's buckets per model-parallel rank, laid out as
//     in distrib_optim.pt but without names: each rank's parameters are rebuilt from the config.
#include "optimizer_state.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "megatron_args.h"

namespace dlm::ckpt::detail {

namespace fs = std::filesystem;
using Kind = PickleValue::Kind;

namespace {

double number(const PickleValue& v, const TorchFile& f, const std::string& key) {
  if (v.is(Kind::kInt)) return static_cast<double>(v.i);
  if (v.is(Kind::kFloat)) return v.f;
  if (v.is(Kind::kTensor)) {
    const Tensor t = f.tensor(v, key);
    if (t.numel() == 1) return t.f32()[0];
  }
  fail_at(f.path(), fmt::format("'{}' is not a number", key));
}

std::int64_t whole_steps(double step, const std::string& file, const std::string& key) {
  if (!(step >= 0) || step != std::floor(step) || step > 1e15) fail_at(file, fmt::format("'{}' is {}, not a step count", key, step));
  return static_cast<std::int64_t>(step);
}

const PickleValue& entry(const PickleValue& dict, const char* key, const std::string& file, const std::string& where) {
  const PickleValue* v = dict.is(Kind::kDict) ? dict.get(key) : nullptr;
  if (!v) fail_at(file, fmt::format("'{}' has no '{}'", where, key));
  return *v;
}

bool truthy_arg(const PickleValue& args, const char* key) {
  const PickleValue* v = args.get(key);
  return v && v->is(Kind::kBool) && v->b;
}

// The single step of every group (megatron keeps them equal); -1 when no group has one.
std::int64_t group_steps(const PickleValue& groups, const TorchFile& f, const std::string& key) {
  std::int64_t steps = -1;
  for (const PickleValue* g : groups.items) {
    const PickleValue* s = g->is(Kind::kDict) ? g->get("step") : nullptr;
    if (!s || s->is(Kind::kNone)) continue;
    const std::int64_t n = whole_steps(number(*s, f, key), f.path(), key);
    if (steps >= 0 && n != steps) fail_at(f.path(), fmt::format("'{}' differs between param groups ({} and {})", key, steps, n));
    steps = n;
  }
  return steps;
}

Tensor shaped(const Tensor& t, const LocalParam& p, const std::string& file, const std::string& key) {
  if (t.numel() != element_count(p.shape))
    fail_at(file, fmt::format("'{}' has {} values, parameter '{}' [{}] has {}", key, t.numel(), p.local, fmt::join(p.shape, ", "), element_count(p.shape)));
  Tensor out = t;
  out.shape = p.shape;
  return out;
}

// Non-distributed: optimizer = {optimizer: {state: {index: {step, exp_avg, exp_avg_sq}}, param_groups},
// fp32_from_fp16_params: [[master per param of the group]]} (Float16OptimizerWithFloat16Params), or the
// torch state dict itself (FP32Optimizer: the weights are the masters).
LocalOptimizerState read_torch_adam(const TorchFile& f, const PickleValue& opt, const std::vector<LocalParam>& params,
                                    const PickleValue& args) {
  const std::string& file = f.path();
  const PickleValue* inner = opt.get("state") ? &opt : opt.get("optimizer");
  if (!inner) fail_at(file, "'optimizer' has neither 'state' nor 'optimizer'");
  const PickleValue& state = entry(*inner, "state", file, "optimizer");
  const PickleValue& groups = entry(*inner, "param_groups", file, "optimizer");
  const PickleValue* masters = opt.get("fp32_from_fp16_params");
  if (!groups.is(Kind::kList) || groups.items.empty() || groups.items.size() > 2)
    fail_at(file, fmt::format("optimizer.param_groups: expected 1 or 2 groups (weight decay on/off), found {}", groups.items.size()));
  // wd_mult 0 holds the 1-D parameters (norms; also q/k norms unless apply_wd_to_qk_layernorm).
  const bool qk_decay = truthy_arg(args, "apply_wd_to_qk_layernorm");
  std::vector<std::vector<std::int64_t>> indices(groups.items.size());
  int decayed = -1, undecayed = -1;
  for (std::size_t g = 0; g < groups.items.size(); ++g) {
    const PickleValue& group = *groups.items[g];
    const std::string key = fmt::format("optimizer.param_groups[{}]", g);
    const PickleValue* lr_mult = group.get("lr_mult");
    const PickleValue* decoupled = group.get("is_decoupled_lr");
    const PickleValue* expert = group.get("is_expert_parallel");
    if ((lr_mult && number(*lr_mult, f, key + ".lr_mult") != 1.0) || (decoupled && decoupled->is(Kind::kBool) && decoupled->b) ||
        (expert && expert->is(Kind::kBool) && expert->b))
      fail_at(file, fmt::format("{}: a group with its own learning rate or of experts cannot be mapped onto dlm's parameters", key));
    const PickleValue* wd = group.get("wd_mult");
    const double wd_mult = wd ? number(*wd, f, key + ".wd_mult") : 1.0;
    int& slot = wd_mult == 0.0 ? undecayed : decayed;
    if (slot >= 0 || (wd_mult != 0.0 && wd_mult != 1.0)) fail_at(file, fmt::format("{}: wd_mult {} cannot be mapped", key, wd_mult));
    slot = static_cast<int>(g);
    for (const PickleValue* i : entry(group, "params", file, key).items) {
      if (!i->is(Kind::kInt)) fail_at(file, fmt::format("{}.params holds a value that is not an index", key));
      indices[g].push_back(i->i);
    }
  }
  std::map<std::int64_t, const PickleValue*> by_index;
  for (const auto& [k, v] : state.entries)
    if (k->is(Kind::kInt)) by_index[k->i] = v;

  LocalOptimizerState out;
  out.steps = -1;
  std::vector<std::size_t> next(groups.items.size(), 0);
  for (const LocalParam& p : params) {
    const bool no_decay = p.shape.size() == 1 && !(qk_decay && (p.local.find("q_layernorm.") != std::string::npos ||
                                                                 p.local.find("k_layernorm.") != std::string::npos));
    const int g = no_decay ? undecayed : decayed;
    if (g < 0 || next[g] >= indices[g].size())
      fail_at(file, fmt::format("optimizer.param_groups has no place for parameter '{}' (named_parameters order, {} group)", p.local,
                                no_decay ? "wd_mult 0" : "weight-decayed"));
    const std::size_t j = next[g]++;
    const std::int64_t index = indices[g][j];
    auto s = by_index.find(index);
    const std::string key = fmt::format("optimizer.state[{}]", index);
    if (s == by_index.end()) fail_at(file, fmt::format("{} (parameter '{}') is missing", key, p.local));
    const PickleValue& st = *s->second;
    out.exp_avg.push_back(shaped(f.tensor(entry(st, "exp_avg", file, key), p.local), p, file, key + ".exp_avg"));
    out.exp_avg_sq.push_back(shaped(f.tensor(entry(st, "exp_avg_sq", file, key), p.local), p, file, key + ".exp_avg_sq"));
    const std::int64_t steps = whole_steps(number(entry(st, "step", file, key), f, key + ".step"), file, key + ".step");
    if (out.steps >= 0 && steps != out.steps) fail_at(file, fmt::format("{}.step is {}, other parameters' {}", key, steps, out.steps));
    out.steps = steps;
    if (masters) {
      const std::string mkey = fmt::format("optimizer.fp32_from_fp16_params[{}][{}]", g, j);
      if (!masters->is(Kind::kList) || static_cast<std::size_t>(g) >= masters->items.size() || j >= masters->items[g]->items.size())
        fail_at(file, fmt::format("{} is missing", mkey));
      out.master.push_back(shaped(f.tensor(*masters->items[g]->items[j], p.local), p, file, mkey));
    }
  }
  for (std::size_t g = 0; g < indices.size(); ++g)
    if (next[g] != indices[g].size())
      fail_at(file, fmt::format("optimizer.param_groups[{}] has {} parameters, the model state dict {}", g, indices[g].size(), next[g]));
  return out;
}

// Where each parameter lies in its grad buffer (_ParamAndGradBuffer with the distributed optimizer):
// parameters in reverse order, each start padded to 64 elements, a new bucket once a bucket reaches
// bucket_size and around a shared embedding. Saved state drops each bucket's end padding, so positions
// are offsets within a bucket, and `bucket_numel` the buckets' unpadded sizes.
struct BufferLayout {
  std::vector<int> bucket;
  std::vector<std::int64_t> offset;
  std::vector<std::int64_t> bucket_numel;
};

BufferLayout buffer_layout(const std::vector<LocalParam>& params, std::optional<std::int64_t> bucket_size) {
  BufferLayout out;
  out.bucket.resize(params.size());
  out.offset.resize(params.size());
  std::int64_t bucket_start = 0, start = 0, end = 0;
  std::size_t in_bucket = 0;
  auto close = [&](std::int64_t bucket_end) {
    out.bucket_numel.push_back(bucket_end - bucket_start);
    bucket_start = bucket_end;  // the padding after it is not saved; positions restart at the next bucket
    in_bucket = 0;
    return bucket_end;
  };
  for (std::size_t k = params.size(); k-- > 0;) {
    const LocalParam& p = params[k];
    start = (start + 63) / 64 * 64;
    if (p.shared_embedding && in_bucket > 0) start = close(start);
    end = start + element_count(p.shape);
    out.bucket[k] = static_cast<int>(out.bucket_numel.size());
    out.offset[k] = start - bucket_start;
    ++in_bucket;
    start = (bucket_size && end - bucket_start >= *bucket_size) || p.shared_embedding ? close(end) : end;
  }
  if (in_bucket > 0) close(end);
  return out;
}

// The DDP bucket size megatron-core used: none (one bucket) unless overlap_grad_reduce.
std::optional<std::int64_t> ddp_bucket_size(const PickleValue& args) {
  std::int64_t value = 0, dp = 1;
  megatron_int_arg(args, "data_parallel_size", dp);
  if (!truthy_arg(args, "overlap_grad_reduce")) return std::nullopt;
  return megatron_int_arg(args, "ddp_bucket_size", value) ? value : std::max<std::int64_t>(40000000, 1000000 * dp);
}

// Distributed: distrib_optim.pt = {buckets_coalesced: True, 0: {(param dtype, grad dtype): {param,
// exp_avg, exp_avg_sq: [numel_unpadded] fp32, numel_unpadded}}}.
LocalOptimizerState read_distrib_optim(const std::string& path, const std::vector<LocalParam>& params, const PickleValue& args) {
  if (!fs::is_regular_file(path)) fail_at(path, "the rank file's optimizer is the distributed optimizer, but its distrib_optim.pt is missing");
  const TorchFile f(path);
  const PickleValue& root = f.root();
  if (root.is(Kind::kList)) fail_at(path, "several chained optimizers (a list) cannot be mapped");
  const PickleValue* coalesced = root.get("buckets_coalesced");
  if (!coalesced || !coalesced->is(Kind::kBool) || !coalesced->b)
    fail_at(path, "no 'buckets_coalesced': True (the per-bucket layout of older megatron-core is not read)");
  const PickleValue* buffer = nullptr;
  for (const auto& [k, v] : root.entries) {
    if (!k->is(Kind::kInt)) continue;
    if (k->i != 0 || buffer) fail_at(path, fmt::format("grad buffer {}: only one buffer (one parameter dtype) is read", k->i));
    buffer = v;
  }
  if (!buffer || !buffer->is(Kind::kDict) || buffer->entries.size() != 1)
    fail_at(path, "grad buffer 0: expected one (param dtype, grad dtype) entry");
  const PickleValue& world = *buffer->entries[0].second;
  const BufferLayout layout = buffer_layout(params, ddp_bucket_size(args));
  std::vector<std::int64_t> at(params.size());
  std::int64_t numel = 0;
  for (std::size_t k = 0; k < params.size(); ++k) {  // buckets one after the other
    at[k] = layout.offset[k];
    for (int b = 0; b < layout.bucket[k]; ++b) at[k] += layout.bucket_numel[b];
  }
  for (std::int64_t n : layout.bucket_numel) numel += n;
  const PickleValue* saved = world.get("numel_unpadded");
  if (!saved || !saved->is(Kind::kInt) || saved->i != numel)
    fail_at(path, fmt::format("grad buffer 0: numel_unpadded {} differs from the {} elements the rank's parameters lay out to",
                              saved && saved->is(Kind::kInt) ? saved->i : -1, numel));
  LocalOptimizerState out;
  const std::pair<const char*, std::vector<Tensor>*> slots[] = {{"param", &out.master}, {"exp_avg", &out.exp_avg}, {"exp_avg_sq", &out.exp_avg_sq}};
  for (const auto& [key, list] : slots) {
    const Tensor all = f.tensor(entry(world, key, path, "grad buffer 0"), key);
    if (all.numel() != numel) fail_at(path, fmt::format("grad buffer 0: '{}' has {} values, expected {}", key, all.numel(), numel));
    for (std::size_t k = 0; k < params.size(); ++k) {
      Tensor t = Tensor::zeros(params[k].local, params[k].shape);
      std::copy(all.f32().begin() + at[k], all.f32().begin() + at[k] + t.numel(), t.f32().begin());
      list->push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace

std::optional<LocalOptimizerState> read_legacy_optimizer_state(const TorchFile& f, const std::vector<LocalParam>& params,
                                                               const PickleValue& args) {
  const PickleValue* opt = f.root().get("optimizer");
  if (!opt || opt->is(Kind::kNone)) return std::nullopt;
  if (opt->is(Kind::kList)) fail_at(f.path(), "'optimizer' is a list of chained optimizers, which cannot be mapped");
  if (!opt->is(Kind::kDict)) fail_at(f.path(), "'optimizer' is not a dict");
  const PickleValue* inner = opt->get("optimizer");
  if (inner && inner->is(Kind::kDict) && !inner->get("state")) {  // DistributedOptimizer.state_dict(): groups only
    const std::string distrib = (fs::path(f.path()).parent_path() / "distrib_optim.pt").string();
    LocalOptimizerState out = read_distrib_optim(distrib, params, args);
    out.steps = group_steps(entry(*inner, "param_groups", f.path(), "optimizer.optimizer"), f, "optimizer.optimizer.param_groups.step");
    if (out.steps < 0) fail_at(f.path(), "optimizer.optimizer.param_groups carry no 'step'");
    return out;
  }
  LocalOptimizerState out = read_torch_adam(f, *opt, params, args);
  if (out.steps < 0) fail_at(f.path(), "optimizer.state is empty");
  return out;
}

std::string torch_dist_optimizer_slot(const std::string& fqn, std::string& model_key) {
  for (const char* slot : {"fp32_param", "param", "exp_avg_sq", "exp_avg"}) {
    const std::string prefix = fmt::format("optimizer.state.{}.", slot);
    if (fqn.starts_with(prefix)) {
      model_key = fqn.substr(prefix.size());
      return std::string(slot) == "fp32_param" ? "param" : slot;
    }
  }
  return "";
}

std::int64_t torch_dist_optimizer_steps(const TorchFile& common) {
  const PickleValue* opt = common.root().get("optimizer");
  const PickleValue* inner = opt && opt->is(Kind::kDict) ? opt->get("optimizer") : nullptr;
  if (!inner || !inner->is(Kind::kDict)) return -1;
  const PickleValue* state = inner->get("state");
  if (const PickleValue* step = state && state->is(Kind::kDict) ? state->get("common_step") : nullptr) {
    const std::string key = "optimizer.optimizer.state.common_step";
    return whole_steps(number(*step, common, key), common.path(), key);
  }
  const PickleValue* groups = inner->get("param_groups");
  return groups && groups->is(Kind::kList) ? group_steps(*groups, common, "optimizer.optimizer.param_groups.step") : -1;
}

bool dp_reshardable_key(const std::string& fqn, int& group, int& bucket, std::string& slot, const std::string& file) {
  const std::string head = "optimizer.distributed.dp_group_idx_";
  const std::size_t b = fqn.rfind(".bucket_idx_");
  if (!fqn.starts_with(head) || b == std::string::npos) return false;
  if (fqn.find(".gbuf_idx_0.") == std::string::npos) fail_at(file, fmt::format("'{}': only grad buffer 0 (one parameter dtype) is read", fqn));
  char* end = nullptr;
  group = static_cast<int>(std::strtol(fqn.c_str() + head.size(), &end, 10));
  bucket = static_cast<int>(std::strtol(fqn.c_str() + b + 12, &end, 10));
  if (*end != '.') fail_at(file, fmt::format("'{}' is not a bucket tensor key", fqn));
  slot = end + 1;
  if (slot != "param" && slot != "exp_avg" && slot != "exp_avg_sq") fail_at(file, fmt::format("'{}': unknown optimizer slot '{}'", fqn, slot));
  return true;
}

namespace {

// One stage's parameters on one TP rank, in megatron-core's named_parameters order. The local spec puts
// input_layernorm first in a layer; Transformer Engine's fuses the norms into linear_qkv / linear_fc1
// (layer_norm_weight before weight).
std::vector<LocalParam> stage_params(const ModelConfig& c, const ParallelLayout& l, int stage, int layers, bool te) {
  const std::int64_t tp = l.tp, h = c.hidden_size, f = c.ffn_hidden_size, kv = c.kv_channels;
  const bool first = stage == 0, last = stage == l.pp - 1, shared = l.pp > 1 && c.tie_word_embeddings;
  std::vector<LocalParam> out;
  if (first) out.push_back({"embedding.word_embeddings.weight", {c.padded_vocab_size() / tp, h}, shared});
  for (int n = 0; n < layers; ++n) {
    const std::string at = fmt::format("decoder.layers.{}.", n);
    if (!te) out.push_back({at + "input_layernorm.weight", {h}});
    out.push_back({at + "self_attention.linear_proj.weight", {h, c.q_size() / tp}});
    if (te) out.push_back({at + "self_attention.linear_qkv.layer_norm_weight", {h}});
    out.push_back({at + "self_attention.linear_qkv.weight", {(c.q_size() + 2 * c.kv_size()) / tp, h}});
    if (c.qk_layernorm) {
      out.push_back({at + "self_attention.q_layernorm.weight", {kv}});
      out.push_back({at + "self_attention.k_layernorm.weight", {kv}});
    }
    out.push_back({at + (te ? "mlp.linear_fc1.layer_norm_weight" : "pre_mlp_layernorm.weight"), {h}});
    out.push_back({at + "mlp.linear_fc1.weight", {2 * f / tp, h}});
    out.push_back({at + "mlp.linear_fc2.weight", {h, f / tp}});
  }
  if (last) {
    out.push_back({"decoder.final_layernorm.weight", {h}});
    if (!(c.tie_word_embeddings && l.pp == 1)) out.push_back({"output_layer.weight", {c.padded_vocab_size() / tp, h}, shared});
  }
  return out;
}

// Whether `layout` of `params` is what rank `group` saved: its buckets' sizes, and each parameter at a chunk start.
bool lays_out_to(const std::vector<LocalParam>& params, const BufferLayout& layout, const DpReshardableState& state, int group) {
  std::size_t buckets = 0;
  for (const auto& [key, bucket] : state) {
    if (key.first != group) continue;
    if (key.second != static_cast<int>(buckets) || buckets >= layout.bucket_numel.size()) return false;
    for (const auto& [slot, t] : bucket.slots)
      if (t.numel() != layout.bucket_numel[buckets]) return false;
    ++buckets;
  }
  if (buckets != layout.bucket_numel.size()) return false;
  for (std::size_t k = 0; k < params.size(); ++k)
    if (!state.at({group, layout.bucket[k]}).chunk_starts.count(layout.offset[k])) return false;
  return true;
}

}  // namespace

void read_dp_reshardable(const DpReshardableState& state, const ModelConfig& config, const ParallelLayout& layout,
                         const PickleValue& args, const std::string& where, TensorSet& masters, TensorSet& exp_avg,
                         TensorSet& exp_avg_sq) {
  if (config.num_layers % layout.pp)
    fail_at(where, fmt::format("dp_reshardable optimizer state: {} layers do not split evenly over {} stages", config.num_layers, layout.pp));
  const int layers = config.num_layers / layout.pp;
  std::map<std::string, std::map<std::string, std::vector<Tensor>>> shards;  // slot -> dlm name -> per TP rank
  for (int group = 0; group < layout.tp * layout.pp; ++group) {
    const int t = group % layout.tp, stage = group / layout.tp;
    std::vector<LocalParam> params;
    std::optional<BufferLayout> found;
    for (bool te : {false, true}) {
      params = stage_params(config, layout, stage, layers, te);
      BufferLayout l = buffer_layout(params, ddp_bucket_size(args));
      if (lays_out_to(params, l, state, group)) {
        found = std::move(l);
        break;
      }
    }
    if (!found)
      fail_at(where, fmt::format("optimizer.distributed.dp_group_idx_{}: the saved buckets do not match the grad-buffer layout of TP rank {} "
                                 "stage {} (megatron-core's local or Transformer Engine parameter order)", group, t, stage));
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::string name = megatron_to_dlm_name(params[k].local, stage * layers, where);
      if (config.tie_word_embeddings && name == "output_layer.weight") continue;  // the last stage's copy
      for (const auto& [slot, flat] : state.at({group, found->bucket[k]}).slots) {
        Tensor one = Tensor::zeros(name, params[k].shape);
        std::copy(flat.f32().begin() + found->offset[k], flat.f32().begin() + found->offset[k] + one.numel(), one.f32().begin());
        auto& list = shards[slot][name];
        if (static_cast<int>(list.size()) != t) fail_at(where, fmt::format("dp_reshardable optimizer state: '{}' out of TP order", name));
        list.push_back(std::move(one));
      }
    }
  }
  for (auto& [slot, by_name] : shards) {
    TensorSet& into = slot == "param" ? masters : slot == "exp_avg" ? exp_avg : exp_avg_sq;
    for (auto& [name, list] : by_name) {
      Tensor merged = merge_megatron_tp(name, std::move(list), where);
      merged.name = name;
      into[name] = std::move(merged);
    }
  }
}

std::int64_t dp_reshardable_steps(const TorchFile& object) {
  const PickleValue& root = object.root();  // a ShardedObject of shape (1,): saved as a one-element list
  const PickleValue* state = root.is(Kind::kList) && root.items.size() == 1 ? root.items[0] : &root;
  const PickleValue* groups = state->is(Kind::kDict) ? state->get("param_groups") : nullptr;
  if (!groups || !groups->is(Kind::kList)) fail_at(object.path(), "the distributed optimizer's state has no 'param_groups'");
  return group_steps(*groups, object, "param_groups.step");
}

void adopt_optimizer_state(MegatronCheckpoint& m, TensorSet masters, const std::string& where) {
  if (m.exp_avg.empty() && m.exp_avg_sq.empty() && masters.empty()) return;
  if (m.state.optimizer_steps <= 0) fail_at(where, "optimizer moments without a step count");
  for (const auto& [name, weight] : m.tensors) {
    for (TensorSet* set : {&m.exp_avg, &m.exp_avg_sq}) {
      auto it = set->find(name);
      if (it == set->end()) fail_at(where, fmt::format("optimizer state has no {} for '{}'", set == &m.exp_avg ? "exp_avg" : "exp_avg_sq", name));
      if (it->second.shape != weight.shape) fail_at(where, fmt::format("optimizer state of '{}' has another shape than the weight", name));
    }
  }
  for (const TensorSet* set : std::initializer_list<const TensorSet*>{&m.exp_avg, &m.exp_avg_sq, &masters})
    for (const auto& entry : *set)
      if (!m.tensors.count(entry.first)) fail_at(where, fmt::format("optimizer state for '{}', which has no place in dlm's model", entry.first));
  for (auto& [name, master] : masters) {
    if (master.shape != m.tensors.at(name).shape) fail_at(where, fmt::format("fp32 master of '{}' has another shape than the weight", name));
    master.name = name;
    m.tensors[name] = std::move(master);
  }
}

}  // namespace dlm::ckpt::detail
