// A checkpoint opened for sampling: libckpt reads either kind into global fp32 tensors, the model runs
// on the CPU backend, and the samplers see it only as a logits function.
#include "generation_model.h"

#include <fmt/format.h>

#include "dlm/ckpt/tools.h"
#include "dlm/common/log.h"
#include "dlm/train/model.h"
#include "dlm/train/model_adapters.h"

namespace dlm::tools {
namespace {

struct Owner {
  std::unique_ptr<train::Backend> backend;
  std::unique_ptr<train::Model> model;
};

}  // namespace

GenerationModel open_generation_model(const std::string& checkpoint, int threads) {
  ckpt::HfModel loaded = ckpt::load_any(checkpoint);
  auto owner = std::make_shared<Owner>();
  owner->backend = train::make_cpu_backend(threads);
  owner->model = std::make_unique<train::Model>(loaded.config, *owner->backend);
  owner->model->import_weights(loaded.tensors);
  log::info("{}: {} layers, hidden {}, {} parameters, {} attention", checkpoint, loaded.config.num_layers,
            loaded.config.hidden_size, owner->model->parameter_count(),
            loaded.config.attention_mask == ckpt::AttentionMask::kCausal ? "causal" : "bidirectional");
  GenerationModel g;
  g.config = loaded.config;
  g.logits = train::make_logits_fn(*owner->model);
  g.vocab = loaded.config.padded_vocab_size();
  g.keep_alive = owner;
  return g;
}

}  // namespace dlm::tools
