#include "dlm/ckpt/sharding.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::ckpt {

std::vector<int> ParallelLayout::stage_layers(const ModelConfig& c) const {
  if (pp <= 0) fail(fmt::format("invalid parallel layout: pp {} must be positive", pp));
  if (!layers_per_stage.empty()) {
    if (static_cast<int>(layers_per_stage.size()) != pp)
      fail(fmt::format("invalid parallel layout: {} stage sizes for pp {}", layers_per_stage.size(), pp));
    for (int n : layers_per_stage)
      if (n < 0) fail(fmt::format("invalid parallel layout: negative stage size {}", n));
    if (std::accumulate(layers_per_stage.begin(), layers_per_stage.end(), 0) != c.num_layers)
      fail(fmt::format("invalid parallel layout: stage sizes do not sum to num_layers {}", c.num_layers));
    return layers_per_stage;
  }
  if (pp > c.num_layers) fail(fmt::format("invalid parallel layout: pp {} is more than num_layers {}", pp, c.num_layers));
  std::vector<int> out(pp, c.num_layers / pp);
  for (int s = 0; s < c.num_layers % pp; ++s) ++out[s];
  return out;
}

void ParallelLayout::validate(const ModelConfig& c) const {
  if (tp <= 0 || dp <= 0) fail(fmt::format("invalid parallel layout: tp {} and dp {} must be positive", tp, dp));
  stage_layers(c);
  if (c.num_query_groups % tp != 0)
    fail(fmt::format("invalid parallel layout: tp {} does not divide num_query_groups {}", tp, c.num_query_groups));
  if (c.ffn_hidden_size % tp != 0)
    fail(fmt::format("invalid parallel layout: tp {} does not divide ffn_hidden_size {}", tp, c.ffn_hidden_size));
  if (ep <= 0) fail(fmt::format("invalid parallel layout: ep {} must be positive", ep));
  if (ep > 1 && (c.num_experts == 0 || c.num_experts % ep != 0))
    fail(fmt::format("invalid parallel layout: ep {} does not divide num_experts {}", ep, c.num_experts));
  if (c.num_experts > 0 && c.moe_ffn_hidden_size % tp != 0)
    fail(fmt::format("invalid parallel layout: tp {} does not divide moe_ffn_hidden_size {}", tp, c.moe_ffn_hidden_size));
  if (c.num_experts > 0 && c.moe_shared_expert_intermediate_size % tp != 0)
    fail(fmt::format("invalid parallel layout: tp {} does not divide moe_shared_expert_intermediate_size {}", tp,
                     c.moe_shared_expert_intermediate_size));
  if (c.padded_vocab_size() % tp != 0)
    fail(fmt::format("invalid parallel layout: tp {} does not divide the padded vocabulary {}", tp, c.padded_vocab_size()));
}

LayerRange stage_layer_range(const ModelConfig& c, const ParallelLayout& layout, int pp_rank) {
  const std::vector<int> sizes = layout.stage_layers(c);
  if (pp_rank < 0 || pp_rank >= layout.pp) fail(fmt::format("pp_rank {} outside [0, {})", pp_rank, layout.pp));
  LayerRange r;
  for (int s = 0; s < pp_rank; ++s) r.first += sizes[s];
  r.count = sizes[pp_rank];
  return r;
}

std::vector<TensorShard> rank_shards(const ModelConfig& c, const ParallelLayout& layout, int tp_rank, int pp_rank,
                                     int ep_rank) {
  c.validate();
  layout.validate(c);
  if (tp_rank < 0 || tp_rank >= layout.tp) fail(fmt::format("tp_rank {} outside [0, {})", tp_rank, layout.tp));
  if (ep_rank < 0 || ep_rank >= layout.ep) fail(fmt::format("ep_rank {} outside [0, {})", ep_rank, layout.ep));
  const LayerRange layers = stage_layer_range(c, layout, pp_rank);
  const bool first_stage = pp_rank == 0, last_stage = pp_rank == layout.pp - 1;
  const std::int64_t tp = layout.tp, r = tp_rank;
  std::vector<TensorShard> out;
  for (const TensorSpec& spec : model_tensors(c)) {
    const std::string& n = spec.name;
    bool held = false, saved = true;
    if (n.starts_with("decoder.layers.")) {
      const int layer = std::stoi(n.substr(15));
      held = layer >= layers.first && layer < layers.first + layers.count;
    } else if (n == "embedding.word_embeddings.weight") {
      held = first_stage || (c.tie_word_embeddings && last_stage);
      saved = first_stage;
    } else {
      held = last_stage;
    }
    if (!held) continue;
    TensorShard s{n, spec.shape, spec.shape, {}, saved, spec.is_norm};
    auto split = [&](int dim, std::int64_t part, std::vector<std::int64_t> starts) {
      s.local_shape[dim] = part * static_cast<std::int64_t>(starts.size());
      for (std::size_t i = 0; i < starts.size(); ++i) s.pieces.push_back({dim, starts[i], static_cast<std::int64_t>(i) * part, part});
    };
    // An expert tensor [E, ...] is split along the experts (ep), then each expert as a dense linear (tp).
    const bool experts = n.find(".mlp.experts.") != std::string::npos;
    const int at = experts ? 1 : 0;  // the dimension of a dense tensor's rows
    if (experts && layout.ep > 1) {
      const std::int64_t part = spec.shape[0] / layout.ep;
      split(0, part, {ep_rank * part});
    }
    if (spec.is_norm || n.find(".mlp.router.") != std::string::npos) {
      s.pieces.push_back({0, 0, 0, spec.shape[0]});  // whole
      s.saved = saved && tp_rank == 0;
    } else if (tp == 1 && (experts || n.find(".mlp.shared_experts.") != std::string::npos)) {
      if (s.pieces.empty()) s.pieces.push_back({0, 0, 0, spec.shape[0]});  // whole, as saved before tensor parallelism
    } else if (n.ends_with("linear_qkv.weight") || n == "embedding.word_embeddings.weight" || n == "output_layer.weight") {
      const std::int64_t part = spec.shape[0] / tp;  // QKV: whole KV groups, since tp | G
      split(0, part, {r * part});
    } else if (n.ends_with("linear_fc1.weight")) {
      const std::int64_t f = spec.shape[at] / 2;  // ffn_hidden_size, moe_ffn_hidden_size or the shared expert's
      split(at, f / tp, {r * (f / tp), f + r * (f / tp)});
    } else {  // linear_proj, linear_fc2: row-parallel, split along the input (column) dimension
      const std::int64_t part = spec.shape[at + 1] / tp;
      split(at + 1, part, {r * part});
    }
    if (layout.ep > 1 && n.find(".mlp.experts.") == std::string::npos) s.saved = s.saved && ep_rank == 0;
    out.push_back(std::move(s));
  }
  return out;
}

std::int64_t Box::volume() const {
  std::int64_t v = 1;
  for (std::int64_t l : length) v *= l;
  return v;
}

std::vector<ShardBox> shard_boxes(const std::vector<ShardPiece>& pieces, const std::vector<std::int64_t>& global_shape) {
  const std::size_t rank = global_shape.size();
  std::vector<ShardBox> out(1);
  out[0].global = {std::vector<std::int64_t>(rank, 0), global_shape};
  out[0].local = out[0].global;
  for (std::size_t d = 0; d < rank; ++d) {
    std::vector<const ShardPiece*> along;
    for (const ShardPiece& p : pieces)
      if (p.dim == static_cast<int>(d)) along.push_back(&p);
    if (along.empty()) continue;
    std::vector<ShardBox> next;
    for (const ShardBox& b : out)
      for (const ShardPiece* p : along) {
        ShardBox x = b;
        x.global.start[d] = p->global_start;
        x.local.start[d] = p->local_start;
        x.global.length[d] = x.local.length[d] = p->length;
        next.push_back(std::move(x));
      }
    out = std::move(next);
  }
  return out;
}

Box intersect(const Box& a, const Box& b) {
  Box out{a.start, a.length};
  for (std::size_t d = 0; d < a.start.size(); ++d) {
    const std::int64_t lo = std::max(a.start[d], b.start[d]);
    const std::int64_t hi = std::min(a.start[d] + a.length[d], b.start[d] + b.length[d]);
    out.start[d] = lo;
    out.length[d] = std::max<std::int64_t>(hi - lo, 0);
  }
  return out;
}

void copy_box(const Tensor& src, const std::vector<std::int64_t>& src_start, Tensor& dst,
              const std::vector<std::int64_t>& dst_start, const std::vector<std::int64_t>& length) {
  const std::size_t rank = length.size(), e = dtype_size(src.dtype);
  if (rank == 0) return;
  for (std::int64_t l : length)
    if (l == 0) return;
  // Row-major strides in elements; the last dimension's run is one memcpy.
  std::vector<std::int64_t> ss(rank, 1), ds(rank, 1);
  for (std::size_t d = rank - 1; d-- > 0;) {
    ss[d] = ss[d + 1] * src.shape[d + 1];
    ds[d] = ds[d + 1] * dst.shape[d + 1];
  }
  std::vector<std::int64_t> i(rank, 0);  // the position inside the box, last dimension fixed at 0
  while (true) {
    std::int64_t so = 0, dof = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      so += (src_start[d] + i[d]) * ss[d];
      dof += (dst_start[d] + i[d]) * ds[d];
    }
    std::memcpy(dst.bytes.data() + dof * e, src.bytes.data() + so * e, static_cast<std::size_t>(length[rank - 1]) * e);
    std::size_t d = rank - 1;
    while (d > 0 && ++i[d - 1] == length[d - 1]) i[--d] = 0;
    if (d == 0) return;
  }
}

Tensor extract_shard(const Tensor& global, const TensorShard& shard) {
  if (global.shape != shard.global_shape) fail(fmt::format("tensor {}: shape does not match its shard's global shape", shard.name));
  Tensor local = Tensor::zeros(shard.name, shard.local_shape, global.dtype);
  for (const ShardBox& b : shard_boxes(shard.pieces, shard.global_shape))
    copy_box(global, b.global.start, local, b.local.start, b.global.length);
  return local;
}

void insert_shard(const Tensor& local, const TensorShard& shard, Tensor& global) {
  if (local.shape != shard.local_shape || global.shape != shard.global_shape)
    fail(fmt::format("tensor {}: shapes do not match the shard", shard.name));
  for (const ShardBox& b : shard_boxes(shard.pieces, shard.global_shape))
    copy_box(local, b.local.start, global, b.global.start, b.global.length);
}

}  // namespace dlm::ckpt
