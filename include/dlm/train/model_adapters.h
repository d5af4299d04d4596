// A Model as the trainer and the samplers see it (trainer.h, sampler.h), so that neither names the
// model nor its backend.
#pragma once

#include <memory>

#include "dlm/train/model.h"
#include "dlm/train/sampler.h"
#include "dlm/train/trainer.h"

namespace dlm::train {

// forward_backward / forward_loss run the batch with its mask (causal or bidirectional), positions and
// labels, and return sum_i weights_i * CE_i (double accumulation). parameters() are host fp32 views
// of the backend's memory: this needs a backend whose memory is host fp32 (the CPU backend; a
// dlm::Error otherwise). The model must outlive the adapter.
std::unique_ptr<TrainableModel> make_trainable_model(Model& model);

// logits(batch, out): out = [rows, len, padded_vocab_size()] fp32 with the config's attention, the
// batch's position ids and its attention row as key padding; padded vocabulary columns are -inf, so
// they never win a sample. The model must outlive the function.
LogitsFn make_logits_fn(Model& model);
// The same logits from Model::forward_storing_kv (full) and Model::forward_window (window), for
// diffusion_generate_cached. The model must outlive the functions.
CachedLogitsModel make_cached_logits_model(Model& model);

// What the adapters of a Model and of a ParallelModel (model_parallel.h) share:
// the model's input for a micro-batch (its mask kind and position ids; no key padding);
ModelInput model_input(const ModelBatch& batch);
// sum_i weights_i * ce_i, double accumulation (a dlm::Error when the sizes differ);
double weighted_loss(std::span<const float> weights, std::span<const float> ce);
// a parameter as the host optimizer sees it: views of `backend`'s memory, the global shape for
// checkpoints (a dlm::Error when that memory is not host fp32).
ParamRef host_param_ref(Backend& backend, const Parameter& p);

}  // namespace dlm::train
