// The TP/PP sharding rules of dlm's Llama-style model: which slice of each global tensor a rank holds.
// docs/sharding.md explains them; the trainer builds its local parameters from rank_shards(), and the
// checkpoint store writes and reads exactly these slices.
//
// Tensor parallelism (tp ranks; r = tp_rank):
//   linear_qkv       column-parallel by KV group: rank r holds groups [r*G/tp, (r+1)*G/tp), i.e. the
//                    contiguous rows of those groups ([q heads | k | v] per group). Needs tp | G.
//   linear_proj      row-parallel: columns [r*Q/tp, (r+1)*Q/tp) (the heads of r's groups).
//   linear_fc1       column-parallel on each half: gate rows [r*F/tp, ...) then up rows [F + r*F/tp, ...),
//                    so the local tensor is again [gate_r ; up_r]. Needs tp | F.
//   linear_fc2       row-parallel: columns [r*F/tp, (r+1)*F/tp).
//   embedding/output vocab-parallel: rows [r*V/tp, (r+1)*V/tp) of the padded vocabulary. Needs tp | V.
//   norms            replicated; tp_rank 0's copy is the one saved.
// Pipeline parallelism (pp stages; s = pp_rank): stage s holds layers [first, first + count) of
// stage_layers(); the embedding lives on stage 0, the final norm and output layer on the last stage.
// With tied embeddings and pp > 1 the last stage also holds the embedding (a replica, not saved).
// Mixture-of-experts layers under tensor parallelism (expert tensor parallelism = tp, megatron-core's default):
//   mlp.experts.linear_fc1 [E, 2F', H]   each expert column-parallel as linear_fc1 (F' = moe_ffn_hidden_size):
//                                        gate rows [r*F'/tp, ..) and up rows [F' + r*F'/tp, ..) along dim 1
//   mlp.experts.linear_fc2 [E, H, F']    each expert row-parallel as linear_fc2: columns [r*F'/tp, ..) along dim 2
//   mlp.shared_experts.linear_fc1/fc2    as linear_fc1/fc2 with F = the shared expert's size
//   mlp.router                           replicated; tp_rank 0's copy is the one saved.
// Expert parallelism (ep ranks; e = ep_rank, MoE layers): mlp.experts.* also split along the expert dimension,
// rank e holding experts [e*E/ep, (e+1)*E/ep); every other tensor is replicated over ep and saved by ep_rank 0.
// A shard that splits several dimensions (an expert tensor under tp and ep) holds the product of its pieces:
// along each dimension the pieces of that dimension, whole along a dimension no piece splits (shard_boxes()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/tensor.h"

namespace dlm::ckpt {

struct ParallelLayout {
  int tp = 1;
  int pp = 1;
  int dp = 1;                         // recorded only: every DP replica holds the same model-space state
  std::vector<int> layers_per_stage{};  // empty = balanced, the first num_layers % pp stages one layer more
  int ep = 1;                           // expert-parallel ranks (divides num_experts); last, so {tp, pp, dp, stages} reads as before

  // Layers of each stage (length pp, summing to num_layers); throws dlm::Error when impossible.
  std::vector<int> stage_layers(const ModelConfig& config) const;
  // Throws dlm::Error naming the rule broken (tp not dividing the KV groups, ffn or padded vocabulary...).
  void validate(const ModelConfig& config) const;
};

// Elements [global_start, global_start + length) of the global tensor along `dim` sit at
// [local_start, local_start + length) of the local tensor (the other dimensions: see TensorShard).
struct ShardPiece {
  int dim = 0;
  std::int64_t global_start = 0, local_start = 0, length = 0;
};

struct TensorShard {
  std::string name;  // the global tensor's name
  std::vector<std::int64_t> global_shape, local_shape;
  std::vector<ShardPiece> pieces;  // per split dimension its pieces; the shard is their product (shard_boxes())
  bool saved = true;    // false for replicas another rank saves
  bool is_norm = false;
};

// The first layer and the layer count of stage pp_rank.
struct LayerRange {
  int first = 0, count = 0;
};
LayerRange stage_layer_range(const ModelConfig& config, const ParallelLayout& layout, int pp_rank);

// Everything rank (tp_rank, pp_rank, ep_rank) holds, in model_tensors() order.
std::vector<TensorShard> rank_shards(const ModelConfig& config, const ParallelLayout& layout, int tp_rank, int pp_rank,
                                     int ep_rank = 0);

// A box of a tensor: along each dimension d, [start[d], start[d] + length[d]).
struct Box {
  std::vector<std::int64_t> start, length;
  std::int64_t volume() const;
};
// One box of a shard: `global` in the global tensor sits at `local` in the local tensor (the same lengths).
struct ShardBox {
  Box global, local;
};
// The boxes of a shard's pieces: the product over the dimensions they split of each dimension's pieces, whole
// along the others. One piece per box when a single dimension is split.
std::vector<ShardBox> shard_boxes(const std::vector<ShardPiece>& pieces, const std::vector<std::int64_t>& global_shape);
// The common part of two boxes of one tensor (volume 0 when they do not meet).
Box intersect(const Box& a, const Box& b);

// Cuts a rank's local tensor out of a global one, and puts it back.
Tensor extract_shard(const Tensor& global, const TensorShard& shard);
void insert_shard(const Tensor& local, const TensorShard& shard, Tensor& global);

// Copies a box of `length` between two row-major tensors of one dtype: src at src_start -> dst at dst_start.
void copy_box(const Tensor& src, const std::vector<std::int64_t>& src_start, Tensor& dst,
              const std::vector<std::int64_t>& dst_start, const std::vector<std::int64_t>& length);

}  // namespace dlm::ckpt
