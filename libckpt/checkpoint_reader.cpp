// CheckpointReader: loads any rank of any TP/PP layout from a checkpoint saved under another one.
//
// For each tensor the target rank holds, every (source box, target box) pair (sharding.h's shard_boxes) that
// overlaps becomes one copy. A source dataset whose copies cover all of it is read whole
// (and its checksum verified); otherwise only the overlapping hyperslabs are read.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "dlm/ckpt/checkpoint.h"
#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "h5.h"
#include "hash.h"

namespace dlm::ckpt {

namespace fs = std::filesystem;

CheckpointReader::CheckpointReader(const std::string& path) : dir_(resolve_checkpoint(path)) {
  const std::string meta = (fs::path(dir_) / "metadata.json").string();
  metadata_ = metadata_from_json(read_text_file(meta), meta);
  for (const TensorRecord& t : metadata_.tensors)
    for (const ShardRecord& s : t.shards)
      if (!fs::exists(fs::path(dir_) / s.file)) fail_at(meta, fmt::format("shard file '{}' is missing", s.file));
}

namespace {

// One box read from a source shard: at `src` of its local tensor, to `dst` of the target's, `length` long.
struct Copy {
  std::vector<std::int64_t> src, dst, length;
  std::int64_t volume() const { return Box{src, length}.volume(); }
};

}  // namespace

TrainingTensors CheckpointReader::read_rank(const ParallelLayout& layout, int tp_rank, int pp_rank, bool with_optimizer,
                                            int ep_rank) const {
  const ModelConfig& c = metadata_.config;
  const std::vector<TensorShard> targets = rank_shards(c, layout, tp_rank, pp_rank, ep_rank);
  const bool optimizer = with_optimizer && metadata_.groups.size() == 3;
  std::map<std::string, const TensorRecord*> records;
  for (const TensorRecord& t : metadata_.tensors) records[t.name] = &t;
  std::map<std::string, std::unique_ptr<detail::H5File>> files;
  auto file = [&](const std::string& name) -> const detail::H5File& {
    auto& f = files[name];
    if (!f) f = std::make_unique<detail::H5File>(detail::H5File::open_read((fs::path(dir_) / name).string()));
    return *f;
  };

  TrainingTensors out;
  for (const TensorShard& target : targets) {
    auto rec = records.find(target.name);
    if (rec == records.end()) fail_at(dir_, fmt::format("checkpoint has no tensor '{}' (its config disagrees)", target.name));
    const TensorRecord& record = *rec->second;
    if (record.shape != target.global_shape)
      fail_at(dir_, fmt::format("tensor '{}' is [{}] in the checkpoint, [{}] in the model", target.name,
                                fmt::join(record.shape, ", "), fmt::join(target.global_shape, ", ")));
    // The saved shards do not overlap (writer and validate()), so the copies cover the target when their volumes
    // add up to it.
    const std::vector<ShardBox> wanted = shard_boxes(target.pieces, target.global_shape);
    std::int64_t covered = 0, needed = 0;
    for (const ShardBox& w : wanted) needed += w.global.volume();
    std::vector<std::pair<const ShardRecord*, std::vector<Copy>>> plan;
    for (const ShardRecord& src : record.shards) {
      std::vector<Copy> copies;
      for (const ShardBox& sb : shard_boxes(src.pieces, record.shape)) {
        for (const ShardBox& tb : wanted) {
          const Box common = intersect(sb.global, tb.global);
          if (common.volume() == 0) continue;
          Copy cp{common.start, common.start, common.length};
          for (std::size_t d = 0; d < common.start.size(); ++d) {
            cp.src[d] += sb.local.start[d] - sb.global.start[d];
            cp.dst[d] += tb.local.start[d] - tb.global.start[d];
          }
          covered += cp.volume();
          copies.push_back(std::move(cp));
        }
      }
      if (!copies.empty()) plan.emplace_back(&src, std::move(copies));
    }
    if (covered != needed)
      fail_at(dir_, fmt::format("tensor '{}': the shard files cover {} of the {} elements this rank needs", target.name,
                                covered, needed));

    auto load_group = [&](const std::string& group) {
      Tensor local = Tensor::zeros(target.name, target.local_shape);
      for (const auto& [src, copies] : plan) {
        const detail::H5File& h5 = file(src->file);
        std::int64_t used = 0;
        for (const Copy& cp : copies) used += cp.volume();
        if (h5.shape_f32(group, target.name) != src->local_shape)
          fail_at(h5.path(), fmt::format("dataset /{}/{} does not have the shape metadata.json gives", group, target.name));
        if (used == Box{{}, src->local_shape}.volume()) {  // the whole source dataset is needed: read it, verify it
          const std::vector<std::int64_t> origin(src->local_shape.size(), 0);
          const bool direct = copies.size() == 1 && src->local_shape == target.local_shape && copies[0].src == origin &&
                              copies[0].dst == origin;
          Tensor whole = direct ? Tensor() : Tensor::zeros(target.name, src->local_shape);
          Tensor& buffer = direct ? local : whole;
          h5.read_f32(group, target.name, buffer.f32().data());
          const std::string sum = detail::checksum_string(buffer.bytes.data(), buffer.bytes.size());
          if (sum != src->checksums.at(group))
            fail_at(h5.path(), fmt::format("dataset /{}/{}: checksum mismatch ({} read, {} recorded): the file is damaged",
                                           group, target.name, sum, src->checksums.at(group)));
          if (!direct)
            for (const Copy& cp : copies) copy_box(whole, cp.src, local, cp.dst, cp.length);
        } else {
          for (const Copy& cp : copies)
            h5.read_slab_f32(group, target.name, src->local_shape, {cp.src, cp.length}, local.f32().data(),
                             target.local_shape, {cp.dst, cp.length});
        }
      }
      return local;
    };
    out.params[target.name] = load_group("model");
    if (optimizer) {
      out.exp_avg[target.name] = load_group("exp_avg");
      out.exp_avg_sq[target.name] = load_group("exp_avg_sq");
    }
  }
  return out;
}

}  // namespace dlm::ckpt
