// The data-parallel gradient sum overlapped with a CudaModel's backward (Megatron's --overlap-grad-reduce
// without the distributed optimizer): the fp32 gradient buffer is cut at layer boundaries from its end (the
// order the backward finishes it) into buckets of at least `bucket_elements`, and each bucket's all-reduce
// starts as soon as the backward of the layers inside it is enqueued, on a communication stream of its own:
//
//   model stream:  ... layer l backward --record--> ... layer l-1 backward ... | wait(all buckets) | norm, AdamW
//   comm stream:                         wait --> all_reduce(bucket)  ...      ^ record
//
// Arm it for the step's last backward only (before it the gradients still accumulate: Megatron's no_sync).
// The last bucket (the embedding and the first layers) follows the backward in finish(). Written against
// DeviceGroup, so it runs over NCCL and over the groups staged through MPI that the one-GPU tests use
// (those stage each bucket on the host: correct, no overlap). A rank's reducers (one per pipeline chunk)
// share one communication stream, so a group's operations stay on one stream in the order every rank
// issues them.
#pragma once

#include <cstdint>
#include <vector>

#include "dlm/train/cuda_model.h"
#include "dlm/train/device_group.h"

namespace dlm::train {

class CudaGradReducer {
 public:
  // `comm_stream`: a cudaStream_t to share (another reducer's stream()); null: one of its own. `model` and
  // `data` must outlive the reducer.
  CudaGradReducer(CudaModel& model, DeviceGroup& data, std::int64_t bucket_elements, void* comm_stream = nullptr);
  ~CudaGradReducer();
  CudaGradReducer(const CudaGradReducer&) = delete;
  CudaGradReducer& operator=(const CudaGradReducer&) = delete;

  // Before the step's last backward: sets the model's backward layer hook to layer_done().
  void start();
  // Layer `layer`'s backward was enqueued (the model's hook): all-reduce the gradients from its first tensor to
  // the last bucket's start once they are at least a bucket.
  void layer_done(int layer);
  // After the backward: clears the hook, all-reduces what is left, and makes the model's stream wait for every
  // bucket. The host must complete() the group before it reads anything the reduction wrote.
  void finish();
  bool started() const { return started_; }
  // Buckets of the last start()..finish(): in all, and those launched from the hook (during the backward).
  int buckets() const { return buckets_; }
  int buckets_in_backward() const { return in_backward_; }
  void* stream() const { return comm_; }

 private:
  void reduce(std::int64_t begin);
  CudaModel& model_;
  DeviceGroup& data_;
  std::int64_t bucket_;
  float* base_ = nullptr;
  std::int64_t end_ = 0, pending_end_ = 0;
  std::vector<std::int64_t> layer_begin_;  // by global layer index; end_ for a layer this model lacks
  void* comm_ = nullptr;                   // cudaStream_t
  bool own_stream_ = false;
  void* ready_ = nullptr;                  // cudaEvent_t on the model's stream: a bucket's gradients enqueued
  void* reduced_ = nullptr;                // cudaEvent_t on the comm stream: every bucket reduced
  bool started_ = false;
  int buckets_ = 0, in_backward_ = 0;
};

}  // namespace dlm::train
