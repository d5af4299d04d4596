// Pipeline-parallel schedules: Megatron's 1F1B and, with virtual stages, its interleaved 1F1B, over the
// model chunks one rank holds (chunk v of rank r is global stage v * PP + r; libckpt counts those as the
// layout's pp). Activations go to the next stage and gradients to the previous one through the pipeline
// group's point-to-point transfers: sends return at once, receives block, so any dependency-respecting
// order runs without deadlock; each receiving stage has its own tags (forward 2g, backward 2g + 1).
//
// Order of work on rank r of P with M micro-batches and V chunks (Megatron's schedules.py):
//   V = 1:  warm-up min(P - r - 1, M) forwards, then one forward + one backward alternately, then the
//           remaining backwards (1F1B: at most P - r micro-batches in flight).
//   V > 1:  forward unit k runs chunk (k mod PV) / P on micro-batch (k / PV) P + k mod P, backward unit k
//           chunk V - 1 - (k mod PV) / P; warm-up (P - r - 1) 2 + (V - 1) P units (all of them when
//           M == P), then 1F1B over units. Needs M to be a multiple of P.
// Every rank gets the same micro-batches (they are cheap to make: the data order and noise are keyed by
// the global sample index); only the last stage's loss counts, and it is summed over the group.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "dlm/train/communicator.h"
#include "dlm/train/model.h"
#include "dlm/train/objective.h"

namespace dlm::train {

struct PipelineCounters {
  int max_in_flight = 0;  // the most micro-batches whose activations one chunk held at once
};

// One step's micro-batches through the pipeline, forward and backward (gradients add into the chunks').
// `chunks` are this rank's in virtual-stage order. Returns sum_b sum_i w_i CE_i on every pipeline rank.
// `gradient_hook` (--overlap-grad-reduce) is armed on each chunk for its last micro-batch's backward
// (Model::set_gradient_hook) and called with (chunk, parameter index in the chunk).
double pipeline_forward_backward(std::span<Model* const> chunks, Communicator& pipeline,
                                 std::span<const ModelBatch> batches, PipelineCounters* counters = nullptr,
                                 const std::function<void(int, std::size_t)>& gradient_hook = {});
// The same losses, forward only.
double pipeline_forward_only(std::span<Model* const> chunks, Communicator& pipeline, std::span<const ModelBatch> batches);

// The schedule itself, for tests and the dry run: (is_forward, chunk, micro-batch) in the order rank
// `rank` runs them.
struct PipelineUnit {
  bool forward = true;
  int chunk = 0;
  int micro_batch = 0;
};
std::vector<PipelineUnit> pipeline_order(int pipeline_size, int rank, int virtual_stages, int micro_batches);
// The interleaved schedule's rule (dlm::Error naming the flags otherwise): micro-batches per data-parallel
// rank a multiple of the pipeline size. dlm-train checks it before anything starts.
void check_interleaved_micro_batches(int pipeline_size, std::int64_t micro_batches);

}  // namespace dlm::train
