// What dlm-generate needs of a checkpoint: the model's logits as a sampler callback, and the
// tokenizer and special ids that go with it. A native dlm checkpoint (libckpt's store) and a Hugging
// Face folder (config.json + safetensors through libckpt's mapping) both open here.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dlm/ckpt/model_config.h"
#include "dlm/data/tokenizer.h"
#include "dlm/train/cuda_options.h"
#include "dlm/train/sampler.h"

namespace dlm::tools {

struct GenerationModel {
  ckpt::ModelConfig config;
  train::LogitsFn logits;
  train::GreedyFn greedy;  // the GPU's greedy fast path (empty on the CPU)
  train::CachedLogitsModel cached;  // the block KV cache's forwards (--kv-cache; with the greedy paths on the GPU)
  std::int64_t vocab = 0;  // logits per position (the padded vocabulary; the real one on the GPU)
  std::shared_ptr<void> keep_alive;  // owns the model behind `logits`
};

// `checkpoint`: a dlm checkpoint folder or a Hugging Face model folder; throws dlm::Error naming the
// file and field when it cannot be used. `device`: --device ("" = the default, see train/device.h); `cuda`: the
// GPU model's options (--deterministic-mode, --cuda-attention, --no-cuda-graphs, --fp8: a dlm::Error where the model
// runs on the CPU).
GenerationModel open_generation_model(const std::string& checkpoint, int threads, const std::string& device,
                                      const train::CudaOptions& cuda);

}  // namespace dlm::tools
