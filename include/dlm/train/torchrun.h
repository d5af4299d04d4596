// Ranks that torchrun (torch.distributed.run) started: its environment names the rank (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE) and the c10d TCPStore its agent hosts (MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_USE_AGENT_STORE=True, as torch 2.x's torchrun sets it). dlm joins that store as a client
// (tcp_store.h) under the prefix "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>/dlm/", so a restarted
// attempt never reads the keys of the one before, and the ranks' host collectives go through Gloo,
// which meets through the store; no MPI is involved. The GPU's NCCL world takes its unique id from the same
// store (device_groups.h).
#pragma once

#include <memory>

#include "dlm/train/communicator.h"
#include "dlm/train/parallel.h"
#include "dlm/train/tcp_store.h"

namespace dlm::train {

struct TorchrunWorld {
  std::shared_ptr<TcpStore> store;
  std::unique_ptr<Communicator> world;  // Gloo, with the store's roll call
};

// Collective over torchrun's ranks (`launch.launcher` == "torchrun"). One-line dlm::Error when the store is
// not reachable within `timeout_seconds` (naming MASTER_ADDR:MASTER_PORT and the rank), when torchrun hosts
// no agent store (TORCHELASTIC_USE_AGENT_STORE is not True: torch 1.x), or when this build has no Gloo.
TorchrunWorld join_torchrun(const LaunchInfo& launch, double timeout_seconds);

}  // namespace dlm::train
