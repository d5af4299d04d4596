// expert_dispatch_plan.h: rows to and from each rank, and the permutation to local-expert order.
#include "expert_dispatch_plan.h"

#include <numeric>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train {

ExpertDispatchPlan plan_expert_dispatch(std::span<const int> mine, std::span<const int> got, int ranks) {
  const int E = static_cast<int>(mine.size());
  if (ranks <= 0 || E % ranks != 0 || got.size() != mine.size())
    fail(fmt::format("expert dispatch: {} and {} counts for {} expert-parallel ranks", mine.size(), got.size(), ranks));
  const int local = E / ranks;
  ExpertDispatchPlan p;
  p.send.assign(static_cast<std::size_t>(ranks), 0), p.recv.assign(static_cast<std::size_t>(ranks), 0);
  for (int e = 0; e < E; ++e) {
    p.send[static_cast<std::size_t>(e / local)] += mine[static_cast<std::size_t>(e)];
    p.recv[static_cast<std::size_t>(e / local)] += got[static_cast<std::size_t>(e)];  // q = index / E_l
  }
  std::vector<int> start(static_cast<std::size_t>(E));
  std::exclusive_scan(got.begin(), got.end(), start.begin(), 0);
  p.received = E > 0 ? start.back() + got.back() : 0;
  p.perm.resize(static_cast<std::size_t>(p.received)), p.inv.resize(p.perm.size());
  p.offsets.resize(static_cast<std::size_t>(local) + 1);
  int j = 0;
  for (int e = 0; e < local; ++e) {
    p.offsets[static_cast<std::size_t>(e)] = j;
    for (int q = 0; q < ranks; ++q) {
      const auto at = static_cast<std::size_t>(q * local + e);
      for (int i = 0; i < got[at]; ++i, ++j)
        p.perm[static_cast<std::size_t>(j)] = start[at] + i, p.inv[static_cast<std::size_t>(start[at] + i)] = j;
    }
  }
  p.offsets[static_cast<std::size_t>(local)] = j;
  return p;
}

}  // namespace dlm::train
