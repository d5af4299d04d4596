// The host's plan of one MoE layer's expert dispatch on the GPU (backend/cuda/moe_dispatch.h), from the counts
// exchange. With EP ranks each holding E_l = E / EP experts, a rank's routed rows, sorted by expert, go to their
// experts' ranks in that order; the rows a rank receives come as (source rank q, local expert e, i) and are
// permuted to (e, q, i), so that each local expert's rows are contiguous for the grouped GEMMs:
//   perm[j] = the received row at permuted row j,   inv[perm[j]] = j,   offsets[e] = local expert e's first row.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dlm::train {

struct ExpertDispatchPlan {
  std::vector<std::int64_t> send, recv;  // rows to and from each EP rank
  int received = 0;
  std::vector<int> perm, inv, offsets;  // [received], [received], [E_l + 1] (the local experts' grouped GEMMs' groups)
};

// mine[e]: this rank's rows of global expert e (E values); got[q * E_l + e]: rank q's rows for local expert e
// (E values, the counts all-to-all's output). dlm::Error when `ranks` does not divide E or the sizes differ.
ExpertDispatchPlan plan_expert_dispatch(std::span<const int> mine, std::span<const int> got, int ranks);

}  // namespace dlm::train
