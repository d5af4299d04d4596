#include "dlm/ckpt/sharding.h"

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
  if (c.num_experts > 0 && tp > 1)
    fail(fmt::format("invalid parallel layout: tp {} with mixture-of-experts layers (tensor parallelism of the experts is "
                     "not in dlm yet)", tp));
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
    const std::int64_t f = c.ffn_hidden_size;
    if (layout.ep > 1 && n.find(".mlp.experts.") != std::string::npos) {
      const std::int64_t part = spec.shape[0] / layout.ep;
      split(0, part, {ep_rank * part});
      s.saved = saved && tp_rank == 0;
    } else if (spec.is_norm || n.find(".mlp.router.") != std::string::npos || n.find(".mlp.experts.") != std::string::npos ||
               n.find(".mlp.shared_experts.") != std::string::npos) {
      s.pieces.push_back({0, 0, 0, spec.shape[0]});  // whole (MoE layers only under tp 1: validate())
      s.saved = saved && tp_rank == 0;
    } else if (n.ends_with("linear_qkv.weight") || n == "embedding.word_embeddings.weight" || n == "output_layer.weight") {
      const std::int64_t part = spec.shape[0] / tp;  // QKV: whole KV groups, since tp | G
      split(0, part, {r * part});
    } else if (n.ends_with("linear_fc1.weight")) {
      split(0, f / tp, {r * (f / tp), f + r * (f / tp)});
    } else {  // linear_proj, linear_fc2: row-parallel, split along the input (column) dimension
      const std::int64_t part = spec.shape[1] / tp;
      split(1, part, {r * part});
    }
    if (layout.ep > 1 && n.find(".mlp.experts.") == std::string::npos) s.saved = s.saved && ep_rank == 0;
    out.push_back(std::move(s));
  }
  return out;
}

void copy_slab(const Tensor& src, std::int64_t src_start, Tensor& dst, std::int64_t dst_start, int dim, std::int64_t length) {
  const std::size_t e = dtype_size(src.dtype);
  if (dim == 0) {
    const std::size_t src_row = src.shape.size() > 1 ? static_cast<std::size_t>(element_count(std::span(src.shape).subspan(1))) * e : e;
    std::memcpy(dst.bytes.data() + dst_start * src_row, src.bytes.data() + src_start * src_row, length * src_row);
    return;
  }
  const std::int64_t rows = src.shape[0], sw = src.shape[1], dw = dst.shape[1];
  for (std::int64_t i = 0; i < rows; ++i)
    std::memcpy(dst.bytes.data() + (i * dw + dst_start) * e, src.bytes.data() + (i * sw + src_start) * e, length * e);
}

Tensor extract_shard(const Tensor& global, const TensorShard& shard) {
  if (global.shape != shard.global_shape) fail(fmt::format("tensor {}: shape does not match its shard's global shape", shard.name));
  Tensor local = Tensor::zeros(shard.name, shard.local_shape, global.dtype);
  for (const ShardPiece& p : shard.pieces) copy_slab(global, p.global_start, local, p.local_start, p.dim, p.length);
  return local;
}

void insert_shard(const Tensor& local, const TensorShard& shard, Tensor& global) {
  if (local.shape != shard.local_shape || global.shape != shard.global_shape)
    fail(fmt::format("tensor {}: shapes do not match the shard", shard.name));
  for (const ShardPiece& p : shard.pieces) copy_slab(local, p.local_start, global, p.global_start, p.dim, p.length);
}

}  // namespace dlm::ckpt
