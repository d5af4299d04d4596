// CheckpointWriter: each rank's shard file, then metadata.json, model.h5 and the commit (checkpoint.h).
#include <filesystem>
#include <fstream>

#include "dlm/ckpt/checkpoint.h"
#include "dlm/common/atomic_file.h"
#include "h5.h"
#include "hash.h"
#include "json_fields.h"

namespace dlm::ckpt {

namespace fs = std::filesystem;
using detail::json;

namespace {

// rank_tpXX_ppYY, with _epZZ under expert parallelism.
std::string rank_name(int tp_rank, int pp_rank, int ep_rank, const ParallelLayout& layout) {
  return fmt::format("rank_tp{:02}_pp{:02}{}", tp_rank, pp_rank, layout.ep > 1 ? fmt::format("_ep{:02}", ep_rank) : "");
}
std::string rank_file(int tp, int pp, int ep, const ParallelLayout& l) { return rank_name(tp, pp, ep, l) + ".h5"; }
// Each rank's checksums travel to the committing rank through a small file beside its shard.
std::string rank_sums_file(int tp, int pp, int ep, const ParallelLayout& l) { return rank_name(tp, pp, ep, l) + ".sums.json"; }
std::string rank_failed_file(int tp, int pp, int ep, const ParallelLayout& l) { return rank_name(tp, pp, ep, l) + ".failed"; }

const float* local_values(const TensorSet& set, const TensorShard& s, const std::string& group) {
  auto it = set.find(s.name);
  if (it == set.end()) fail(fmt::format("checkpoint save: {} tensor '{}' is missing", group, s.name));
  if (it->second.shape != s.local_shape || it->second.dtype != TensorDType::kFloat32)
    fail(fmt::format("checkpoint save: {} tensor '{}' is {} [{}], the rank's shard is F32 [{}]", group, s.name,
                     dtype_name(it->second.dtype), fmt::join(it->second.shape, ", "), fmt::join(s.local_shape, ", ")));
  return reinterpret_cast<const float*>(it->second.bytes.data());
}

const float* local_values(const std::map<std::string, const float*>& set, const TensorShard& s, const std::string& group) {
  auto it = set.find(s.name);
  if (it == set.end() || !it->second) fail(fmt::format("checkpoint save: {} tensor '{}' is missing", group, s.name));
  return it->second;
}

// The iteration `latest` names in `root`, or -1 without a readable one.
std::int64_t latest_iteration(const std::string& root) {
  std::ifstream in(fs::path(root) / "latest");
  std::string name;
  if (!(in >> name) || !name.starts_with("iter_")) return -1;
  try {
    return std::stoll(name.substr(5));
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string root, std::int64_t iteration, ModelConfig config, ParallelLayout layout)
    : root_(std::move(root)), iteration_(iteration), config_(std::move(config)), layout_(std::move(layout)) {
  if (iteration < 0) fail(fmt::format("checkpoint save: negative iteration {}", iteration));
  config_.validate();
  layout_.validate(config_);
  final_dir_ = (fs::path(root_) / iteration_dir_name(iteration)).string();
  temp_dir_ = final_dir_ + ".tmp";
}

// A folder cannot replace another atomically, so an iteration is saved once. One exception: a writer killed
// between renaming its folder into place and replacing `latest` leaves a complete folder that was never
// committed (`latest` names an older iteration or nothing); saving that iteration again replaces it (found
// by the dlm-ckpt kill test under ThreadSanitizer's slower timing).
void CheckpointWriter::claim_final_dir() const {
  if (!fs::exists(final_dir_)) return;
  if (latest_iteration(root_) >= iteration_) fail_at(final_dir_, "already exists: this iteration was saved before");
  fs::remove_all(final_dir_);
}

void CheckpointWriter::begin() {
  claim_final_dir();
  fs::create_directories(root_);
  for (const auto& entry : fs::directory_iterator(root_))
    if (entry.is_directory() && entry.path().filename().string().ends_with(".tmp")) fs::remove_all(entry.path());
  fs::create_directories(temp_dir_);
}

void CheckpointWriter::write_rank(int tp_rank, int pp_rank, const TrainingTensors& local, int ep_rank) {
  TrainingViews views;
  for (const TensorShard& s : rank_shards(config_, layout_, tp_rank, pp_rank, ep_rank)) {
    if (!s.saved) continue;
    views.params[s.name] = local_values(local.params, s, "model");
    if (!local.has_optimizer()) continue;
    views.exp_avg[s.name] = local_values(local.exp_avg, s, "exp_avg");
    views.exp_avg_sq[s.name] = local_values(local.exp_avg_sq, s, "exp_avg_sq");
  }
  write_rank(tp_rank, pp_rank, views, ep_rank);
}

void CheckpointWriter::write_rank(int tp_rank, int pp_rank, const TrainingViews& local, int ep_rank) {
  const std::vector<TensorShard> shards = rank_shards(config_, layout_, tp_rank, pp_rank, ep_rank);
  const std::string path = (fs::path(temp_dir_) / rank_file(tp_rank, pp_rank, ep_rank, layout_)).string();
  detail::H5File h5 = detail::H5File::create(path);
  // HDF5 lays out the file and its metadata; the tensor bytes then go straight to their offsets.
  std::vector<detail::Extent> extents;
  std::vector<std::pair<std::string, std::string>> names;  // (tensor, group) of each extent
  const std::pair<const char*, const std::map<std::string, const float*>*> groups[] = {
      {"model", &local.params}, {"exp_avg", &local.exp_avg}, {"exp_avg_sq", &local.exp_avg_sq}};
  for (const TensorShard& s : shards) {
    if (!s.saved) continue;
    const auto bytes = static_cast<std::size_t>(element_count(s.local_shape)) * sizeof(float);
    for (const auto& [group, set] : groups) {
      if (set != &local.params && !local.has_optimizer()) continue;
      const float* values = local_values(*set, s, group);
      extents.push_back({h5.allocate_f32(group, s.name, s.local_shape), reinterpret_cast<const std::uint8_t*>(values), bytes});
      names.emplace_back(s.name, group);
    }
  }
  h5.close();
  const std::vector<std::string> checksums = detail::write_extents(path, extents);
  json sums = json::object();
  for (std::size_t i = 0; i < names.size(); ++i) sums[names[i].first][names[i].second] = checksums[i];
  write_file_atomically((fs::path(temp_dir_) / rank_sums_file(tp_rank, pp_rank, ep_rank, layout_)).string(), sums.dump());
}

bool CheckpointWriter::all_ranks_written() const {
  bool all = true;
  for (int pp = 0; pp < layout_.pp; ++pp)
    for (int tp = 0; tp < layout_.tp; ++tp)
      for (int ep = 0; ep < layout_.ep; ++ep) {
        const fs::path failed = fs::path(temp_dir_) / rank_failed_file(tp, pp, ep, layout_);
        if (fs::exists(failed))
          fail(fmt::format("rank tp {} pp {}{} failed to write its shard: {}", tp, pp,
                           layout_.ep > 1 ? fmt::format(" ep {}", ep) : "", read_text_file(failed.string())));
        all = all && fs::exists(fs::path(temp_dir_) / rank_sums_file(tp, pp, ep, layout_));
      }
  return all;
}

void CheckpointWriter::report_failure(int tp_rank, int pp_rank, const std::string& message, int ep_rank) const {
  write_file_atomically((fs::path(temp_dir_) / rank_failed_file(tp_rank, pp_rank, ep_rank, layout_)).string(), message);
}

std::string CheckpointWriter::commit(TrainingState state) {
  state.iteration = iteration_;
  CheckpointMetadata m;
  m.config = config_;
  m.layout = layout_;
  m.layout.layers_per_stage = layout_.stage_layers(config_);
  m.state = std::move(state);
  std::map<std::string, TensorRecord> records;
  for (const TensorSpec& spec : model_tensors(config_)) records[spec.name] = {spec.name, spec.shape, TensorDType::kFloat32, spec.is_norm, {}};
  bool optimizer = false;
  std::vector<std::string> sums_files;
  for (int pp = 0; pp < layout_.pp; ++pp) {
    for (int tp = 0; tp < layout_.tp; ++tp) for (int ep = 0; ep < layout_.ep; ++ep) {
      const std::string sums_path = (fs::path(temp_dir_) / rank_sums_file(tp, pp, ep, layout_)).string();
      if (!fs::exists(sums_path))
        fail_at(temp_dir_, fmt::format("rank tp {} pp {}{} did not write its shard", tp, pp,
                                       layout_.ep > 1 ? fmt::format(" ep {}", ep) : ""));
      const json sums = detail::parse_json(read_text_file(sums_path), sums_path);
      sums_files.push_back(sums_path);
      for (const TensorShard& s : rank_shards(config_, layout_, tp, pp, ep)) {
        if (!s.saved) continue;
        if (!sums.contains(s.name)) fail_at(sums_path, fmt::format("no checksum for tensor '{}'", s.name));
        ShardRecord r{rank_file(tp, pp, ep, layout_), s.local_shape, s.pieces, {}};
        for (auto& [group, sum] : sums[s.name].items()) r.checksums[group] = sum.get<std::string>();
        optimizer = r.checksums.count("exp_avg") > 0;
        records[s.name].shards.push_back(std::move(r));
      }
    }
  }
  m.groups = {"model"};
  if (optimizer) m.groups = {"model", "exp_avg", "exp_avg_sq"};
  for (const TensorSpec& spec : model_tensors(config_)) m.tensors.push_back(std::move(records[spec.name]));

  // model.h5: one virtual dataset per global tensor and group, pointing into the rank files by
  // relative name (HDF5 resolves those against model.h5's own folder, so the rename keeps them valid).
  const std::string vds_path = (fs::path(temp_dir_) / "model.h5").string();
  detail::H5File vds = detail::H5File::create(vds_path);
  for (const std::string& group : m.groups) {
    for (const TensorRecord& t : m.tensors) {
      std::vector<detail::H5File::VirtualSource> sources;
      for (const ShardRecord& s : t.shards)
        for (const ShardBox& b : shard_boxes(s.pieces, t.shape))
          sources.push_back({s.file, "/" + group + "/" + t.name, s.local_shape, b.local, b.global});
      vds.create_virtual_f32(group, t.name, t.shape, sources);
    }
  }
  vds.close();
  detail::fsync_file(vds_path);
  write_file_atomically((fs::path(temp_dir_) / "metadata.json").string(), metadata_to_json(m));
  for (const std::string& f : sums_files) fs::remove(f);
  fsync_directory(temp_dir_);

  claim_final_dir();
  fs::rename(temp_dir_, final_dir_);
  fsync_directory(root_);
  write_file_atomically((fs::path(root_) / "latest").string(), iteration_dir_name(iteration_) + "\n");
  return final_dir_;
}

std::string save_checkpoint(const std::string& root, const ModelConfig& config, const ParallelLayout& layout,
                            const TrainingTensors& global, const TrainingState& state) {
  CheckpointWriter w(root, state.iteration, config, layout);
  w.begin();
  try {  // a failed save (a full disk) leaves no temp folder behind
  for (int pp = 0; pp < layout.pp; ++pp) {
    for (int tp = 0; tp < layout.tp; ++tp) for (int ep = 0; ep < layout.ep; ++ep) {
      TrainingTensors local;
      for (const TensorShard& s : rank_shards(config, layout, tp, pp, ep)) {
        if (!s.saved) continue;
        auto cut = [&](const TensorSet& from, TensorSet& to, const char* group) {
          auto it = from.find(s.name);
          if (it == from.end()) fail(fmt::format("checkpoint save: {} tensor '{}' is missing", group, s.name));
          to[s.name] = extract_shard(it->second, s);
        };
        cut(global.params, local.params, "model");
        if (global.has_optimizer()) {
          cut(global.exp_avg, local.exp_avg, "exp_avg");
          cut(global.exp_avg_sq, local.exp_avg_sq, "exp_avg_sq");
        }
      }
      w.write_rank(tp, pp, local, ep);
    }
  }
  return w.commit(state);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(w.temp_dir(), ec);
    throw;
  }
}

}  // namespace dlm::ckpt
