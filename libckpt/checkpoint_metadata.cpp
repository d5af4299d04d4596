// metadata.json <-> CheckpointMetadata, with the checks that make a damaged or hostile file a one-line
// error instead of an out-of-range read later.
#include <algorithm>
#include <filesystem>
#include <set>

#include "dlm/ckpt/checkpoint.h"
#include "dlm/common/atomic_file.h"
#include "json_fields.h"

namespace dlm::ckpt {

using detail::json;

namespace {

constexpr const char* kFormat = "dlm-checkpoint";

json object_or_empty(const std::string& text) { return text.empty() ? json::object() : json::parse(text); }

std::vector<std::int64_t> read_shape(const json& j, const std::string& where, const std::string& file) {
  if (!j.is_array() || j.empty() || j.size() > 3) fail_at(file, fmt::format("{}: expected a shape of 1 to 3 dimensions", where));
  std::vector<std::int64_t> s;
  for (const json& d : j) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0 || d.get<std::int64_t>() > (std::int64_t{1} << 40))
      fail_at(file, fmt::format("{}: dimensions must be integers in [0, 2^40]", where));
    s.push_back(d.get<std::int64_t>());
  }
  return s;
}

const json& member(const json& j, const char* key, const std::string& where, const std::string& file) {
  auto it = j.find(key);
  if (it == j.end()) fail_at(file, fmt::format("{}: missing field '{}'", where, key));
  return *it;
}

// "ep" only under expert parallelism, so that the files of every other layout read as before.
json layout_json(const CheckpointMetadata& m) {
  json l = {{"tp", m.layout.tp}, {"pp", m.layout.pp}, {"dp", m.layout.dp}, {"layers_per_stage", m.layout.stage_layers(m.config)}};
  if (m.layout.ep > 1) l["ep"] = m.layout.ep;
  return l;
}

}  // namespace

std::string metadata_to_json(const CheckpointMetadata& m) {
  json tensors = json::array();
  for (const TensorRecord& t : m.tensors) {
    json shards = json::array();
    for (const ShardRecord& s : t.shards) {
      json pieces = json::array();
      for (const ShardPiece& p : s.pieces)
        pieces.push_back({{"dim", p.dim}, {"global_start", p.global_start}, {"local_start", p.local_start}, {"length", p.length}});
      shards.push_back({{"file", s.file}, {"local_shape", s.local_shape}, {"pieces", pieces}, {"checksums", s.checksums}});
    }
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", dtype_name(t.dtype)}, {"is_norm", t.is_norm}, {"shards", shards}});
  }
  const TrainingState& st = m.state;
  const json j = {
      {"format", kFormat},
      {"version", m.version},
      {"model", json::parse(model_config_to_json(m.config))},
      {"layout", layout_json(m)},
      {"training", {{"iteration", st.iteration}, {"consumed_samples", st.consumed_samples}, {"optimizer_steps", st.optimizer_steps},
                    {"lr_schedule", object_or_empty(st.lr_schedule_json)}, {"rng", object_or_empty(st.rng_json)},
                    {"data", object_or_empty(st.data_json)}, {"args", object_or_empty(st.args_json)}}},
      {"groups", m.groups},
      {"tensors", tensors}};
  return j.dump(1) + "\n";
}

namespace {

CheckpointMetadata parse_metadata(std::string_view text, const std::string& file) {
  const json j = detail::parse_json(text, file);
  if (!j.is_object()) fail_at(file, "metadata must be a JSON object");
  CheckpointMetadata m;
  if (auto f = j.find("format"); f == j.end() || !f->is_string() || f->get<std::string>() != kFormat) fail_at(file, fmt::format("field 'format': expected \"{}\"", kFormat));
  m.version = detail::require_field<int>(j, "version", file);
  if (m.version != 1) fail_at(file, fmt::format("field 'version': {} is not supported (expected 1)", m.version));
  const json& model = member(j, "model", "metadata", file);
  m.config = model_config_from_json(model.dump(), file);

  const json& layout = member(j, "layout", "metadata", file);
  if (!layout.is_object()) fail_at(file, "field 'layout': expected an object");
  m.layout.tp = detail::require_field<int>(layout, "tp", file);
  m.layout.pp = detail::require_field<int>(layout, "pp", file);
  m.layout.dp = detail::require_field<int>(layout, "dp", file);
  if (layout.contains("ep")) m.layout.ep = detail::require_field<int>(layout, "ep", file);  // absent: 1
  const json& stages = member(layout, "layers_per_stage", "layout", file);
  if (!stages.is_array() || stages.size() > 1u << 16) fail_at(file, "layout: 'layers_per_stage' must be an array");
  for (const json& n : stages) {
    if (!n.is_number_integer()) fail_at(file, "layout: 'layers_per_stage' entries must be integers");
    m.layout.layers_per_stage.push_back(n.get<int>());
  }
  try {
    m.layout.validate(m.config);
  } catch (const Error& e) {
    fail_at(file, e.message());
  }

  const json& tr = member(j, "training", "metadata", file);
  if (!tr.is_object()) fail_at(file, "field 'training': expected an object");
  detail::read_field(tr, "iteration", m.state.iteration, file);
  detail::read_field(tr, "consumed_samples", m.state.consumed_samples, file);
  detail::read_field(tr, "optimizer_steps", m.state.optimizer_steps, file);
  // A negative count would be read back as a huge unsigned sample position by the data order.
  const std::pair<const char*, std::int64_t> counts[] = {
      {"iteration", m.state.iteration}, {"consumed_samples", m.state.consumed_samples}, {"optimizer_steps", m.state.optimizer_steps}};
  for (const auto& [key, value] : counts)
    if (value < 0) fail_at(file, fmt::format("training: '{}' is {}, expected a count >= 0", key, value));
  auto sub = [&](const char* key, std::string& out) {
    if (auto it = tr.find(key); it != tr.end()) {
      if (!it->is_object()) fail_at(file, fmt::format("training: '{}' must be an object", key));
      out = it->dump();
    }
  };
  sub("lr_schedule", m.state.lr_schedule_json);
  sub("rng", m.state.rng_json);
  sub("data", m.state.data_json);
  sub("args", m.state.args_json);

  static const std::set<std::string> known_groups = {"model", "exp_avg", "exp_avg_sq"};
  const json& groups = member(j, "groups", "metadata", file);
  if (!groups.is_array()) fail_at(file, "field 'groups': expected an array");
  for (const json& g : groups) {
    if (!g.is_string() || !known_groups.count(g.get<std::string>())) fail_at(file, fmt::format("field 'groups': unknown group {}", g.dump()));
    m.groups.push_back(g.get<std::string>());
  }
  if (m.groups.empty() || m.groups[0] != "model") fail_at(file, "field 'groups': must start with \"model\"");

  const json& tensors = member(j, "tensors", "metadata", file);
  if (!tensors.is_array()) fail_at(file, "field 'tensors': expected an array");
  std::set<std::string> names;
  for (const json& t : tensors) {
    if (!t.is_object()) fail_at(file, "tensors: entries must be objects");
    TensorRecord r;
    r.name = detail::require_field<std::string>(t, "name", file);
    if (!names.insert(r.name).second) fail_at(file, fmt::format("tensors: '{}' is listed twice", r.name));
    const std::string where = fmt::format("tensor '{}'", r.name);
    r.shape = read_shape(member(t, "shape", where, file), where + " shape", file);
    const std::string dtype = detail::require_field<std::string>(t, "dtype", file);
    if (dtype != "F32") fail_at(file, fmt::format("{}: dtype '{}' (native checkpoints are F32)", where, dtype));
    detail::read_field(t, "is_norm", r.is_norm, file);
    const json& shards = member(t, "shards", where, file);
    if (!shards.is_array()) fail_at(file, fmt::format("{}: 'shards' must be an array", where));
    for (const json& s : shards) {
      if (!s.is_object()) fail_at(file, fmt::format("{}: shard entries must be objects", where));
      ShardRecord sr;
      sr.file = detail::require_field<std::string>(s, "file", file);
      if (sr.file.empty() || sr.file.find('/') != std::string::npos || !sr.file.ends_with(".h5") || sr.file == "model.h5")
        fail_at(file, fmt::format("{}: shard file '{}' must be a rank .h5 file in the checkpoint folder", where, sr.file));
      sr.local_shape = read_shape(member(s, "local_shape", where, file), where + " local_shape", file);
      if (sr.local_shape.size() != r.shape.size()) fail_at(file, fmt::format("{}: local_shape rank differs from shape", where));
      const json& pieces = member(s, "pieces", where, file);
      if (!pieces.is_array() || pieces.empty()) fail_at(file, fmt::format("{}: 'pieces' must be a non-empty array", where));
      for (const json& p : pieces) {
        if (!p.is_object()) fail_at(file, fmt::format("{}: pieces must be objects", where));
        ShardPiece sp{detail::require_field<int>(p, "dim", file), detail::require_field<std::int64_t>(p, "global_start", file),
                      detail::require_field<std::int64_t>(p, "local_start", file), detail::require_field<std::int64_t>(p, "length", file)};
        if (sp.dim < 0 || sp.dim >= static_cast<int>(r.shape.size()) || sp.global_start < 0 || sp.local_start < 0 || sp.length < 0 ||
            sp.global_start > r.shape[sp.dim] - sp.length || sp.local_start > sr.local_shape[sp.dim] - sp.length)
          fail_at(file, fmt::format("{}: piece (dim {}, global_start {}, local_start {}, length {}) lies outside the tensor or its shard",
                                    where, sp.dim, sp.global_start, sp.local_start, sp.length));
        sr.pieces.push_back(sp);
      }
      for (std::size_t d = 0; d < r.shape.size(); ++d) {
        const bool split = std::any_of(sr.pieces.begin(), sr.pieces.end(), [&](const ShardPiece& p) { return p.dim == static_cast<int>(d); });
        if (!split && sr.local_shape[d] != r.shape[d])
          fail_at(file, fmt::format("{}: shard is partial along dimension {} that no piece splits", where, d));
      }
      const json& sums = member(s, "checksums", where, file);
      if (!sums.is_object()) fail_at(file, fmt::format("{}: 'checksums' must be an object", where));
      for (auto it = sums.begin(); it != sums.end(); ++it) {
        if (!it->is_string()) fail_at(file, fmt::format("{}: checksum of '{}' must be a string", where, it.key()));
        sr.checksums[it.key()] = it->get<std::string>();
      }
      for (const std::string& g : m.groups)
        if (!sr.checksums.count(g)) fail_at(file, fmt::format("{}: shard in {} has no checksum for group '{}'", where, sr.file, g));
      r.shards.push_back(std::move(sr));
    }
    m.tensors.push_back(std::move(r));
  }
  return m;
}

}  // namespace

CheckpointMetadata metadata_from_json(std::string_view text, const std::string& file) {
  try {
    return parse_metadata(text, file);
  } catch (const json::exception& e) {  // a type the checks above did not foresee
    fail_at(file, fmt::format("malformed metadata ({})", e.what()));
  }
}

std::string iteration_dir_name(std::int64_t iteration) { return fmt::format("iter_{:07}", iteration); }

std::string resolve_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  while (!p.empty() && !p.has_filename()) p = p.parent_path();
  if (p.filename().string().ends_with(".tmp")) fail_at(path, "is an unfinished checkpoint (*.tmp), never loaded");
  if (fs::exists(p / "metadata.json")) return p.string();
  const fs::path latest = p / "latest";
  if (!fs::exists(latest)) fail_at(path, "no metadata.json and no 'latest' file: not a dlm checkpoint");
  std::string name = read_text_file(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.size() > 255)  // no folder name is longer; the filesystem would refuse it in a raw exception
    fail_at(latest.string(), fmt::format("holds {} bytes, expected a folder name such as iter_0000100", name.size()));
  if (name.empty() || name.find('/') != std::string::npos || name.ends_with(".tmp"))
    fail_at(latest.string(), fmt::format("names '{}', not a checkpoint folder", name));
  if (!fs::exists(p / name / "metadata.json")) fail_at(latest.string(), fmt::format("names '{}', which has no metadata.json", name));
  return (p / name).string();
}

}  // namespace dlm::ckpt
