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
// Expert parallelism (ep ranks; e = ep_rank, MoE layers, tp 1): mlp.experts.* split along the expert dimension,
// rank e holding experts [e*E/ep, (e+1)*E/ep); every other tensor is replicated and saved by ep_rank 0.
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
// [local_start, local_start + length) of the local tensor; every other dimension is whole.
struct ShardPiece {
  int dim = 0;
  std::int64_t global_start = 0, local_start = 0, length = 0;
};

struct TensorShard {
  std::string name;  // the global tensor's name
  std::vector<std::int64_t> global_shape, local_shape;
  std::vector<ShardPiece> pieces;
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

// Cuts a rank's local tensor out of a global one, and puts it back.
Tensor extract_shard(const Tensor& global, const TensorShard& shard);
void insert_shard(const Tensor& local, const TensorShard& shard, Tensor& global);

// Copies `length` elements along `dim` (all of the other dimension) between two row-major fp32 2-D or
// 1-D tensors: src[src_start...] -> dst[dst_start...].
void copy_slab(const Tensor& src, std::int64_t src_start, Tensor& dst, std::int64_t dst_start, int dim, std::int64_t length);

}  // namespace dlm::ckpt
