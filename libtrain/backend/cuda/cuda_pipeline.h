// Megatron's 1F1B pipeline schedule over CudaModel stages, its transfers enqueued on the model's stream
// through the pipeline group's DeviceGroup (NCCL point-to-point). The order of work is pipeline_order()'s
// (pipeline_schedule.h); the transfers are Megatron's p2p_communication pairs, each posted as one group so
// that two neighbouring stages never wait on each other:
//   warm-up:  recv_forward, forward, send_forward
//   steady:   forward, send_forward + recv_backward, backward, send_backward + recv_forward
//   cool-down: recv_backward, backward, send_backward
// Activations travel as bf16 [stage_rows, hidden], gradients as fp32. Nothing here waits on the host: the
// caller completes the groups, then takes the loss.
#pragma once

#include "dlm/train/cuda_model.h"
#include "dlm/train/device_group.h"

namespace dlm::train {

// The micro-batches 0 .. micro_batches - 1, already uploaded (CudaModel::upload_inputs), through this rank's
// stage: forward and backward (training), or forward only. `pipeline` may be null with one stage.
// Returns the most micro-batches whose activations were held at once.
int cuda_pipeline_run(CudaModel& model, DeviceGroup* pipeline, int micro_batches, bool training);

}  // namespace dlm::train
