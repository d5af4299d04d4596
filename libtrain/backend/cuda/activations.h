// CudaModel's activations for one micro-batch shape, allocated from the shape's CudaActivationLayout
// (dlm/train/cuda_memory_plan.h, which the dry run's plan sums as well): the work buffers every micro-batch
// reuses, one LayerActs per layer per micro-batch in flight (a slot), and the last stage's head inputs per slot.
// T = B * S tokens, Ts of them this rank's rows (T / TP under sequence parallelism, else T).
#pragma once

#include <cstdint>
#include <vector>

#include "device_arena.h"
#include "dlm/train/cuda_memory_plan.h"
#include "kernels.h"

namespace dlm::train::cuda {

// What one layer keeps for its backward. res1/res2 (the residual stream entering each norm) and the rstds
// hold the rank's rows (1/TP of them under SP); h1/h2 (the GEMMs' normed inputs) every row, gathered.
struct MoeLayerActs;
struct LayerActs {
  bf16 *res1, *h1, *qkv_raw, *qkv_rot, *att, *res2, *h2, *gu, *act;
  float *rstd1, *qk_rstd, *lse, *rstd2;
  MoeLayerActs* moe;  // an MoE layer's routing and experts' activations (moe_layer.h, MoeBuffers'); else null
};

// The work buffers every micro-batch reuses. Under SP the *_full ones hold every row (gathered, or before a
// reduce-scatter); otherwise they alias their local buffer.
struct SharedActs {
  bf16 *tmp = nullptr, *tmp_full = nullptr, *hloc = nullptr, *res_f = nullptr, *hf = nullptr, *logits = nullptr;
  // The output layer's packed rows of hf, then (in place, chunk by chunk) their gradient. It is dgu's memory,
  // which only the layers' backward uses, when that is large enough (2 ffn >= d), else a buffer of its own.
  bf16* head_x = nullptr;
  bf16 *dres16 = nullptr, *dres16_full = nullptr, *dh = nullptr, *dh_full = nullptr, *stage_out = nullptr;
  bf16 *dact = nullptr, *dgu = nullptr, *datt = nullptr, *dqkv_rot = nullptr, *dqkv = nullptr;
  float *rstd_f = nullptr, *dres = nullptr, *dres_full = nullptr, *delta = nullptr;
  float* partial = nullptr;  // the norms' per-block weight-gradient sums (their size depends on the device)
  // A stage before the last: where the next stage's gradient arrives, apart from dres (the gradient this stage
  // sends back): the interleaved schedule sends one chunk's and receives its next in the same group.
  float* dres_in = nullptr;
  float *ce_lse = nullptr, *ce_label = nullptr;  // vocabulary-parallel CE: [tp, chunk] lse, [chunk] label logits
  float* emb_partial = nullptr;
  double* loss_total = nullptr;  // the losses since take_loss()
};

// The last stage's head inputs of an activation slot: the final norm's input and output and its rstd.
struct HeadActs {
  bf16 *res_f, *hf;
  float* rstd_f;
};

struct ActivationBuffers {
  CudaActivationLayout layout;
  std::int64_t B = 0, S = 0, T = 0, Ts = 0, chunk = 0;  // T = 0: nothing allocated
  // The shared buffers; res_f, hf and rstd_f point at the head inputs of the slot use_head() chose.
  SharedActs shared;
  std::vector<std::vector<LayerActs>> slots;  // per micro-batch in flight, per layer
  // Full activation recomputation (set_recompute_layers): each layer of a slot keeps only its input (res1); every
  // other buffer of its LayerActs is `work`'s, one layer's worth shared by all layers and slots, which the backward
  // refills by running the layer's forward again before its backward.
  bool recompute = false;
  LayerActs work{};
  // Per slot; slot 0's are the shared buffers. A schedule may run several forwards before their backwards
  // (interleaved 1F1B with as many micro-batches as stages runs every forward first).
  std::vector<HeadActs> head_acts;
  DeviceArena arena;

  // The shared buffers for micro-batches of batch x seq laid out as `l`; slots come on demand. `partial_floats`:
  // the norms' partial sums at this shape. Zeroes the loss total on `stream`.
  void allocate(const CudaActivationLayout& l, std::int64_t batch, std::int64_t seq, std::int64_t partial_floats,
                cudaStream_t stream);
  void release();
  // Slot s's layers (`layers` of them), allocated on first use.
  std::vector<LayerActs>& slot(int s, int layers);
  // Points res_f, hf and rstd_f at slot s's head inputs.
  void use_head(int s);

 private:
  LayerActs layer_acts(bool input);
};

}  // namespace dlm::train::cuda
