// dlm-ckpt validate / compare / inspect.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "dlm/ckpt/tools.h"
#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "h5.h"
#include "hash.h"

namespace dlm::ckpt {

namespace fs = std::filesystem;

std::int64_t count_non_finite(std::span<const float> v) {
  std::int64_t n = 0;
  for (float x : v) n += !std::isfinite(x);
  return n;
}

void refuse_non_finite(const TensorSet& tensors, const std::string& where) {
  for (const auto& [name, t] : tensors)
    if (const std::int64_t bad = count_non_finite(t.f32()))
      fail_at(where, fmt::format("tensor '{}' holds {} NaN/Inf values (dlm-ckpt validate lists them); nothing written",
                                 name, bad));
}

namespace {

// Every element of the tensor in exactly one shard: the shards' boxes (sharding.h's shard_boxes) do not meet and
// their volumes add up to the tensor's.
void check_coverage(const TensorRecord& t, Report& r) {
  if (t.shards.empty()) return r.errors.push_back(fmt::format("tensor '{}': no shard holds it", t.name));
  std::vector<std::pair<Box, const std::string*>> boxes;
  for (const ShardRecord& s : t.shards)
    for (const ShardBox& b : shard_boxes(s.pieces, t.shape)) boxes.emplace_back(b.global, &s.file);
  std::int64_t held = 0;
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    held += boxes[i].first.volume();
    for (std::size_t j = 0; j < i; ++j)
      if (const Box common = intersect(boxes[i].first, boxes[j].first); common.volume() > 0)
        return r.errors.push_back(fmt::format("tensor '{}': {} elements from [{}] are saved twice ({} and {})", t.name,
                                              common.volume(), fmt::join(common.start, ", "), *boxes[j].second,
                                              *boxes[i].second));
  }
  if (const std::int64_t all = Box{{}, t.shape}.volume(); held != all)
    r.errors.push_back(fmt::format("tensor '{}': {} of its {} elements are in no shard", t.name, all - held, all));
}

void validate_native(const std::string& path, Report& r) {
  CheckpointReader reader(path);
  const CheckpointMetadata& m = reader.metadata();
  r.lines.push_back(fmt::format("native checkpoint {} (iteration {}, tp {} pp {}, groups {})", reader.dir(), m.state.iteration,
                                m.layout.tp, m.layout.pp, fmt::join(m.groups, ",")));
  std::map<std::string, const TensorRecord*> by_name;
  for (const TensorRecord& t : m.tensors) by_name[t.name] = &t;
  std::set<std::string> expected;
  for (const TensorSpec& spec : model_tensors(m.config)) {
    expected.insert(spec.name);
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) r.errors.push_back(fmt::format("tensor '{}' of the config is not in the checkpoint", spec.name));
    else if (it->second->shape != spec.shape)
      r.errors.push_back(fmt::format("tensor '{}' is [{}], the config needs [{}]", spec.name, fmt::join(it->second->shape, ", "), fmt::join(spec.shape, ", ")));
  }
  for (const TensorRecord& t : m.tensors) {
    if (!expected.count(t.name)) r.errors.push_back(fmt::format("tensor '{}' is not part of the config's model", t.name));
    check_coverage(t, r);
  }
  std::map<std::string, std::unique_ptr<detail::H5File>> files;
  std::int64_t datasets = 0, bytes = 0, non_finite = 0;
  for (const TensorRecord& t : m.tensors) {
    for (const ShardRecord& s : t.shards) {
      auto& f = files[s.file];
      try {
        if (!f) f = std::make_unique<detail::H5File>(detail::H5File::open_read((fs::path(reader.dir()) / s.file).string()));
        for (const std::string& g : m.groups) {
          if (f->shape_f32(g, t.name) != s.local_shape) {
            r.errors.push_back(fmt::format("{}: /{}/{} has the wrong shape", s.file, g, t.name));
            continue;
          }
          Tensor buf = Tensor::zeros(t.name, s.local_shape);
          f->read_f32(g, t.name, buf.f32().data());
          const std::string sum = detail::checksum_string(buf.bytes.data(), buf.bytes.size());
          if (sum != s.checksums.at(g)) r.errors.push_back(fmt::format("{}: /{}/{}: checksum mismatch ({} read, {} recorded)", s.file, g, t.name, sum, s.checksums.at(g)));
          const std::int64_t bad = count_non_finite(buf.f32());
          if (bad) r.errors.push_back(fmt::format("{}: /{}/{}: {} NaN/Inf values", s.file, g, t.name, bad));
          non_finite += bad;
          ++datasets;
          bytes += static_cast<std::int64_t>(buf.bytes.size());
        }
      } catch (const Error& e) {
        r.errors.push_back(e.what());
      }
    }
  }
  r.lines.push_back(fmt::format("{} tensors, {} datasets, {:.1f} MB checked against their XXH64 checksums; {} NaN/Inf", m.tensors.size(),
                                datasets, bytes / 1e6, non_finite));
  try {
    const detail::H5File vds = detail::H5File::open_read((fs::path(reader.dir()) / "model.h5").string());
    for (const std::string& g : m.groups)
      for (const TensorRecord& t : m.tensors)
        if (vds.shape_f32(g, t.name) != t.shape) r.errors.push_back(fmt::format("model.h5: /{}/{} has the wrong shape", g, t.name));
    r.lines.push_back("model.h5: a virtual dataset of global shape for every tensor");
  } catch (const Error& e) {
    r.errors.push_back(e.what());
  }
}

void validate_hf(const std::string& path, Report& r) {
  const HfModel m = load_hf_folder(path);
  r.lines.push_back(fmt::format("Hugging Face folder {} ({}, {} layers)", path, m.config.hf_architecture, m.config.num_layers));
  std::int64_t non_finite = 0;
  for (const auto& [name, t] : m.tensors) {
    const std::int64_t bad = count_non_finite(t.f32());
    if (bad) r.errors.push_back(fmt::format("{}: {} NaN/Inf values", name, bad));
    non_finite += bad;
  }
  r.lines.push_back(fmt::format("{} tensors map onto the config's model; {} NaN/Inf", m.tensors.size(), non_finite));
}

}  // namespace

Report validate_checkpoint(const std::string& path) {
  Report r;
  try {
    const CheckpointKind kind = detect_kind(path);
    if (kind == CheckpointKind::kHuggingFace) validate_hf(path, r);
    else if (kind == CheckpointKind::kMegatron) validate_megatron(path, r);
    else validate_native(path, r);
  } catch (const Error& e) {
    r.errors.push_back(e.what());
  }
  return r;
}

Report compare_checkpoints(const std::string& a, const std::string& b, double rtol, double atol) {
  Report r;
  const HfModel ma = load_any(a), mb = load_any(b);
  for (const auto& [name, ta] : ma.tensors) {
    auto it = mb.tensors.find(name);
    if (it == mb.tensors.end()) {
      r.errors.push_back(fmt::format("{}: only in {}", name, a));
      continue;
    }
    const Tensor& tb = it->second;
    if (ta.shape != tb.shape) {
      r.errors.push_back(fmt::format("{}: shape [{}] vs [{}]", name, fmt::join(ta.shape, ", "), fmt::join(tb.shape, ", ")));
      continue;
    }
    double max_abs = 0;
    std::int64_t outside = 0;
    const auto fa = ta.f32(), fb = tb.f32();
    for (std::size_t i = 0; i < fa.size(); ++i) {
      const double d = std::fabs(static_cast<double>(fa[i]) - fb[i]);
      max_abs = std::max(max_abs, d);
      outside += !(d <= atol + rtol * std::fabs(static_cast<double>(fb[i])));
    }
    const std::string line = fmt::format("{:<60} max|diff| {:.3g}{}", name, max_abs, outside ? fmt::format(", {} elements outside tolerance", outside) : "");
    (outside ? r.errors : r.lines).push_back(line);
  }
  for (const auto& [name, tb] : mb.tensors)
    if (!ma.tensors.count(name)) r.errors.push_back(fmt::format("{}: only in {}", name, b));
  return r;
}

std::string inspect_checkpoint(const std::string& path) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  if (detect_kind(path) == CheckpointKind::kMegatron) return inspect_megatron(path);
  if (detect_kind(path) == CheckpointKind::kHuggingFace) {
    const HfModel m = load_hf_folder(path);
    const SafetensorsFolder st(path);
    line(fmt::format("Hugging Face folder {}: {}", path, model_config_to_json(m.config)));
    std::int64_t total = 0;
    for (const TensorView* v : st.tensors()) {
      line(fmt::format("  {:<56} {:<5} [{}]", v->name, dtype_name(v->dtype), fmt::join(v->shape, ", ")));
      total += element_count(v->shape);
    }
    line(fmt::format("{} tensors, {} parameters", st.tensors().size(), total));
    return out;
  }
  const CheckpointReader r(path);
  const CheckpointMetadata& m = r.metadata();
  line(fmt::format("dlm checkpoint {}", r.dir()));
  line(fmt::format("model: {}", model_config_to_json(m.config)));
  line(fmt::format("layout: tp {} pp {} dp {}, layers per stage [{}]", m.layout.tp, m.layout.pp, m.layout.dp, fmt::join(m.layout.layers_per_stage, ", ")));
  line(fmt::format("training: iteration {}, consumed samples {}, optimizer steps {}", m.state.iteration, m.state.consumed_samples, m.state.optimizer_steps));
  for (const auto& [k, v] : {std::pair{"lr_schedule", &m.state.lr_schedule_json}, {"rng", &m.state.rng_json}, {"data", &m.state.data_json}, {"args", &m.state.args_json}})
    if (!v->empty() && *v != "{}") line(fmt::format("  {}: {}", k, *v));
  std::int64_t total = 0;
  for (const TensorRecord& t : m.tensors) {
    line(fmt::format("  {:<56} [{}] in {} slice(s)", t.name, fmt::join(t.shape, ", "), t.shards.size()));
    total += element_count(t.shape);
  }
  line(fmt::format("{} tensors, {} parameters, groups {} ({:.1f} MB)", m.tensors.size(), total, fmt::join(m.groups, ","), total * 4.0 * m.groups.size() / 1e6));
  return out;
}

}  // namespace dlm::ckpt
