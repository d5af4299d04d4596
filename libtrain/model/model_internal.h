// What model.cpp (parameters) and model_forward.cpp (the passes) share.
#pragma once

#include <vector>

#include "dlm/train/model.h"
#include "dlm/train/moe_router.h"

namespace dlm::train {

// Indices into Model::params_ of one layer's tensors (-1 when absent: QK-norm off; router/experts in a dense layer;
// in an MoE layer fc1/fc2 are its shared expert's, -1 without one). norm2 is the MLP's input norm either way.
struct Model::Layer {
  int norm1 = -1, qkv = -1, q_norm = -1, k_norm = -1, proj = -1, norm2 = -1, fc1 = -1, fc2 = -1;
  int router = -1, experts_fc1 = -1, experts_fc2 = -1;
  bool moe() const { return router >= 0; }
};

// Expert parallelism: one MoE layer's exchange in the last forward. Each routed slot (token n, choice j) is a row
// sent to the rank holding expert e_j; `order` lists the slots n * k + j grouped by destination rank (ascending),
// so rows are sent and come back in that order.
struct ExpertExchange {
  std::vector<std::int64_t> order;                 // [N * k]
  std::vector<std::int64_t> send_rows, recv_rows;  // per expert-parallel rank
  std::vector<float> outputs;                      // [N * k, hidden]: the experts' outputs of the sent rows, in order
  std::int64_t received = 0;                       // rows this rank's experts ran
  Tensor x, idx, ones, out, gate_up, act;          // those rows, their local expert, weight 1, and the saved activations
};

// The activations of one forward, kept for backward. Reallocated only when the batch shape changes.
// Rows: N = batch * seq tokens; the residual stream and the norms hold local_rows(N) of them (N / TP
// under sequence parallelism), the *g tensors the all-gathered N rows a column-parallel linear reads.
// Feature widths are this rank's shard (heads / TP, ffn / TP, padded vocabulary / TP).
struct Model::Activations {
  struct Layer {
    Tensor x, xn1, xn1g, rstd1, qkv, q, k, v, qn, kn, rstd_q, rstd_k, q_rope, k_rope, attn, lse, h, xn2, xn2g, rstd2,
        gate_up, act;
    // MoE layers: the router's logits [N, E], the chosen experts [N, k] and combine weights [N, k] (also on the
    // host in `routing`); gate_up and act then hold N * k rows of moe_ffn width / TP.
    Tensor router_logits, moe_experts, moe_weights;
    Routing routing;
    Routing real_routing;  // with routed_rows: the router's result over those rows (routing spreads it over all N)
    ExpertExchange exchange;  // expert parallelism only
    Tensor shared_gate_up, shared_act;  // the shared expert's [N, 2 S / TP], [N, S / TP]
  };
  std::int64_t batch = 0, seq = 0;
  AttentionKind attention = AttentionKind::kBidirectional;
  bool has_key_valid = false;
  Tensor ids, positions, key_valid, labels, labels_local, weights;
  // Under SP with pad rows (key_valid 0, pipeline_schedule.cpp's stage_batch): the token rows the MoE router sees,
  // the real ones; empty: every row.
  std::vector<std::int64_t> routed_rows;
  std::vector<Layer> layers;
  Tensor partial;  // [N, hidden]: a row-parallel linear's partial sum before its reduce-scatter (SP)
  Tensor xf, xnf, xnfg, rstdf, logits, ce, ce_lse;
  bool has_ce = false;
  // Gradient scratch (allocated by the first backward()): the residual stream, branch inputs, op outputs;
  // dfull / dxn_full are the N-row versions under sequence parallelism (aliases of dx / dxn otherwise).
  Tensor dx, dtmp, dxn, dxn_full, dfull, dattn, dq, dk, dv, dqn, dkn, dqkv, dact, dgate_up, dlogits;
  Tensor drouter_logits, dmoe_weights;  // MoE layers: [N, E], [N, k]
  Tensor dtmp_full;                     // MoE layers: [N, hidden] scratch (an alias of dtmp without SP)
  Tensor shared_out, dshared_act, dshared_gate_up;  // the shared experts': [N, hidden], [N, S / TP], [N, 2 S / TP]
};

// The keys and values forward_storing_kv() kept, per layer [batch, seq, groups, head_dim], and the
// scratch a window's attention reads: the stored ones with the window's columns written over, masked by
// the window's key padding.
struct Model::KvStore {
  std::int64_t batch = 0, seq = 0;
  std::vector<Tensor> k, v;
  Tensor k_all, v_all, key_valid;
  bool has_key_valid = false;
};

}  // namespace dlm::train
