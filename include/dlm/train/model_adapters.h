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

}  // namespace dlm::train
