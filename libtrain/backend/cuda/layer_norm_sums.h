// The gradient norm's sum of squares taken layer by layer in the step's last backward (CudaModel::
// take_norm_in_next_backward). adamw.cu's norm chunks are cut by the layer whose tensor they hold; in that
// backward, as soon as a layer's gradients are done, its chunks' partial sums are taken on a side stream beside the
// backward of the layers before it, and the norm pass then takes only the other chunks' (the embedding, the final
// norm, the output layer, a tensor no layer names) before it sums every partial in chunk order. The partials and
// their order are those of one pass over every chunk, so the sum is the same bits.
//   off --arm()--> armed --begin_backward()--> taking --end_backward()--> taken
// A backward that finds the parts armed takes them; any other backward, and zero_grad (discard()), leaves them off,
// and the norm pass takes every chunk. A backward with a layer hook (the data-parallel overlap, which reduces the
// layers' gradients after they are done) takes none.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "parameter_store.h"
#include "side_stream.h"

namespace dlm::train::cuda {

class LayerNormSums {
 public:
  // layer_of_spec[p]: the local layer tensor p belongs to (-1: none); `layers` local layers.
  void build(const ParameterStore& params, const std::vector<int>& layer_of_spec, int layers);

  void arm() { state_ = kArmed; }
  void begin_backward(bool layer_hook) { state_ = state_ == kArmed && !layer_hook ? kTaking : kOff; }
  bool taking() const { return state_ == kTaking; }
  // Layer l's gradients are done on `main` (its backward enqueued there): its chunks' partials on the side stream.
  void layer_done(int l, const ParameterStore& params, cudaStream_t main);
  void end_backward() {
    if (state_ == kTaking) state_ = kTaken;
  }
  // `main` waits for the side stream's partials (before anything writes the gradients or the tensor list again).
  void join(cudaStream_t main) {
    if (side_) side_->join(main);
  }
  // zero_grad: the parts no longer stand for the gradients.
  void discard(cudaStream_t main) {
    join(main);
    state_ = kOff;
  }
  // The norm pass on `main`: the partials not taken yet, then their sum into params.sumsq.
  void enqueue_sumsq(const ParameterStore& params, cudaStream_t main);

 private:
  struct Run {
    int first, count;  // norm chunks [first, first + count)
  };
  void enqueue(const std::vector<Run>& runs, const ParameterStore& params, cudaStream_t stream) const;

  std::vector<std::vector<Run>> layer_;  // per local layer
  std::vector<Run> rest_, all_;
  std::unique_ptr<SideStream> side_;
  enum { kOff, kArmed, kTaking, kTaken } state_ = kOff;
};

}  // namespace dlm::train::cuda
