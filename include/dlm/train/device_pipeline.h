// Megatron's 1F1B pipeline schedule over stages whose hidden states live in device memory, the transfers
// enqueued through the pipeline group's DeviceGroup (NCCL point-to-point on the GPU). Each transfer is one of
// Megatron's p2p_communication pairs, posted as one group so that two neighbouring stages never wait on each
// other whatever order they post in:
//   warm-up   (min(P - r - 1, M) micro-batches): recv_forward, forward, send_forward
//   steady    forward, send_forward + recv_backward, backward, send_backward + recv_forward
//   cool-down recv_backward, backward, send_backward
// which is pipeline_order()'s order of work for one chunk per rank (pipeline_schedule.h). Activations travel
// as bf16, gradients as fp32, boundary_elements() of each. Nothing here waits on the host: the caller
// completes the groups, then reads the loss.
#pragma once

#include <cstddef>
#include <span>

#include "dlm/train/device_group.h"

namespace dlm::train {

// One rank's stage as the schedule drives it (CudaModel behind it on the GPU; the tests' host fake).
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  virtual std::size_t boundary_elements() const = 0;
  // bf16: the received activations of the micro-batch that will run on `slot` (not on the first stage).
  virtual void* input(int slot) = 0;
  // bf16: the last forward's output, sent on (not on the last stage); valid until the next forward.
  virtual const void* output() const = 0;
  // fp32: the received gradient of output() that the next backward starts from (not on the last stage).
  virtual float* output_grad() = 0;
  // fp32: the last backward's gradient of its input, sent back (not on the first stage).
  virtual const float* input_grad() const = 0;
  // Micro-batch mb with its activations in `slot` (kept from forward to backward). training off: forward only.
  virtual void forward(int mb, int slot, bool training) = 0;
  virtual void backward(int mb, int slot) = 0;
  virtual void* stream() = 0;
};

// Micro-batches 0 .. micro_batches - 1 through this rank's stage (rank `pipeline->rank()` of its size; null:
// one stage), forward and backward or forward only. Returns the most micro-batches held at once.
int run_pipeline_1f1b(PipelineStage& stage, DeviceGroup* pipeline, int micro_batches, bool training);

// Megatron's interleaved 1F1B over this rank's chunks (chunk v is global stage v * P + r; pipeline_order()'s
// order of work), activations and gradients passed around the ring of ranks in one group per unit. The
// chunks must share one stream; micro_batches must be a multiple of the group's size (dlm::Error).
// Returns the most micro-batches one chunk held at once.
int run_pipeline_interleaved(std::span<PipelineStage* const> chunks, DeviceGroup* pipeline, int micro_batches,
                             bool training);

}  // namespace dlm::train
