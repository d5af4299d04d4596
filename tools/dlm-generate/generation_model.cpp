// A checkpoint opened for sampling: libckpt reads either kind into global fp32 tensors, the model runs
// on the CPU backend or the GPU (--device), and the samplers see it only as a logits function.
#include "generation_model.h"

#include <fmt/format.h>

#include "dlm/ckpt/tools.h"
#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "dlm/train/device.h"
#include "dlm/train/model.h"
#include "dlm/train/model_adapters.h"

namespace dlm::tools {
namespace {

struct Owner {
  std::unique_ptr<train::Backend> backend;
  std::unique_ptr<train::Model> model;
};

}  // namespace

GenerationModel open_generation_model(const std::string& checkpoint, int threads, const std::string& device,
                                      const train::CudaOptions& cuda) {
  const train::Device where = train::resolve_device(device);
  ckpt::HfModel loaded = ckpt::load_any(checkpoint);
  const char* attention = loaded.config.attention_mask == ckpt::AttentionMask::kCausal ? "causal" : "bidirectional";
  if (where == train::Device::kCuda) {
    train::CudaSampling s = train::make_cuda_sampling(loaded.config, loaded.tensors, cuda);
    log::info("{}: {} layers, hidden {}, {} parameters, {} attention, on the GPU", checkpoint, loaded.config.num_layers,
              loaded.config.hidden_size, s.parameters, attention);
    return {loaded.config, std::move(s.logits), std::move(s.greedy), std::move(s.cached), s.vocab, std::move(s.keep_alive)};
  }
  if (cuda.fp8_sampling) fail("--fp8: no GPU to sample on, and the CPU backend has no FP8 GEMMs");
  auto owner = std::make_shared<Owner>();
  owner->backend = train::make_cpu_backend(threads);
  owner->model = std::make_unique<train::Model>(loaded.config, *owner->backend);
  owner->model->import_weights(loaded.tensors);
  log::info("{}: {} layers, hidden {}, {} parameters, {} attention, on the CPU", checkpoint, loaded.config.num_layers,
            loaded.config.hidden_size, owner->model->parameter_count(), attention);
  GenerationModel g;
  g.config = loaded.config;
  g.logits = train::make_logits_fn(*owner->model);
  g.cached = train::make_cached_logits_model(*owner->model);
  g.vocab = loaded.config.padded_vocab_size();
  g.keep_alive = owner;
  return g;
}

}  // namespace dlm::tools
