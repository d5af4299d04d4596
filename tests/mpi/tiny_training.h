// What the MPI training tests share: a deterministic sample source and the trainer options of a short
// run whose every layout must reproduce the single-process run.
#pragma once

#include <cstdint>
#include <span>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/trainer.h"

namespace dlm::test {

// Sample i: a skewed deterministic stream over ids 0 .. ids-1.
class SyntheticSamples final : public train::SampleSource {
 public:
  explicit SyntheticSamples(int ids) : ids_(static_cast<std::uint64_t>(ids)) {}
  std::uint64_t size() const override { return 100000; }
  void read(std::uint64_t index, std::span<std::int32_t> tokens) const override {
    for (std::size_t j = 0; j < tokens.size(); ++j) {
      const std::uint64_t k = index * 37 + j * 5;
      tokens[j] = static_cast<std::int32_t>((k * k + index) % 7 < 3 ? k % 5 : k % ids_);
    }
  }

 private:
  std::uint64_t ids_;
};

// A 32-wide bidirectional model with QK-norm and GQA (4 heads, 2 KV groups): every layout of 4 ranks
// divides it (tensor parallelism 2 splits heads, groups, ffn and the padded vocabulary of 64).
inline ckpt::ModelConfig tiny_model(int layers, int vocab, bool tied) {
  ckpt::ModelConfig c;
  c.num_layers = layers;
  c.hidden_size = 32;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 8;
  c.qk_layernorm = true;
  c.vocab_size = vocab;
  c.make_vocab_size_divisible_by = 16;
  c.max_position_embeddings = 64;
  c.attention_mask = ckpt::AttentionMask::kBidirectional;
  c.tie_word_embeddings = tied;
  return c;
}

// 20 iterations of 8 micro-batches of 2 x 16 tokens, cosine LR with warm-up, weight decay, the diffusion
// objective with variable-length cuts (their draw must not depend on the layout), small DDP buckets
// (several buckets, shards cutting through tensors).
inline train::TrainerOptions tiny_training_options(bool distributed_optimizer, std::int32_t mask_token) {
  train::TrainerOptions o;
  o.train_iters = 20;
  o.micro_batch_size = 2;
  o.global_batch_size = 16;
  o.seq_length = 16;
  o.lr.max_lr = 3e-3;
  o.lr.min_lr = 3e-4;
  o.lr.warmup_iters = 2;
  o.lr.decay_iters = 20;
  o.lr.style = train::LrDecayStyle::kCosine;
  o.lr.global_batch_size = 16;
  o.adam.weight_decay = 0.1;
  o.objective.mask_token = mask_token;
  o.objective.varilen_prob = 0.3;
  o.objective.seed = 5;
  o.use_distributed_optimizer = distributed_optimizer;
  o.ddp_bucket_size = 1500;
  return o;
}

}  // namespace dlm::test
