// Mixture-of-experts metrics of a training step, as megatron-core's track_moe_metrics reports them
// (megatron/core/transformer/moe/moe_utils.py): each MoE layer's router losses without their coefficients
// ("load_balancing_loss" = aux / moe_aux_loss_coeff, "z_loss" = z / moe_z_loss_coeff), tracked only where the
// coefficient is positive, averaged over the step's micro-batches; their mean over the MoE layers is the
// TensorBoard scalar and the log line's field (averaged over the log interval as "lm loss" is), each layer's
// value is "moe/<name>_layer_<i>" (i: the global layer, from 0). dlm adds the load: the tokens routed to each
// expert of each MoE layer in the step (all micro-batches of all data-parallel ranks; k per token).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dlm::train {

// One rank's sums over the micro-batches it ran since the model's last report (TrainableModel::take_moe_sums()):
// per layer of the whole model (zeros for the layers other ranks hold), 2 + experts values: the load balancing
// loss, the z-loss (without coefficients), then the tokens routed to each expert. Summing `values` over the
// data-parallel group and the model's ranks gives the step's.
struct MoeStepSums {
  int experts = 0;
  bool load_balancing = false, z = false;  // tracked: the coefficient is positive
  std::vector<double> values;              // [num_layers, 2 + experts]
};

struct MoeLayerMetrics {
  int layer = 0;  // global index
  double load_balancing_loss = 0, z_loss = 0;  // per micro-batch
  std::vector<double> tokens_per_expert;
};

struct MoeMetrics {
  bool load_balancing = false, z = false;
  std::vector<MoeLayerMetrics> layers;  // the MoE layers (those that routed tokens)
  // Megatron's scalars, in its tracker's order (z_loss first: the router applies it before routing), each the mean
  // over the MoE layers.
  std::vector<std::pair<std::string, double>> losses() const;
};

// The step's metrics from the sums over every rank and the global batch's micro-batch count.
MoeMetrics moe_metrics(const MoeStepSums& sums, std::int64_t micro_batches);
// dlm's log line after Megatron's iteration line: " moe load (max / mean tokens per expert) | layer 0: 1.250 | ...";
// the load of a layer is its busiest expert's tokens over the mean (1: balanced). moe_max_load: the largest over the
// layers (the JSONL file's "moe_max_load").
std::string moe_load_line(const MoeMetrics& metrics);
double moe_max_load(const MoeMetrics& metrics);

}  // namespace dlm::train
