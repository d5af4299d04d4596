// Gloo behind the communicator seam: the host collectives of ranks that torchrun started (no MPI world).
// Gloo's TCP pairs meet through the c10d store (a gloo::rendezvous::Store over TcpStore); every operation
// is bounded by 80% of --distributed-timeout-minutes (at least the timeout less 30 s), then the store's roll
// call names the lost rank in the CommunicationError, as the MPI communicator does:
//   "all_reduce #57 of 4 bytes on the world (2 ranks) did not complete within 0.1 min
//    (--distributed-timeout-minutes): rank 1 did not answer (dead or hung)"
// A group split from it is a Gloo context of its own, meeting under a key prefix that names its parent's
// prefix, the split's index in the parent and the color. Making a group returns on a member once every member
// has connected it (they confirm through the store), so its members may leave it at once.
#pragma once

#include <memory>

#include "dlm/train/communicator.h"

namespace dlm::train {

class TcpStore;

// Collective over the `size` ranks that meet in `store`. `loopback`: every rank is on this host (Gloo then
// listens on 127.0.0.1; else on the address of GLOO_SOCKET_IFNAME, or of the host name, as torch's Gloo does).
std::unique_ptr<Communicator> gloo_world_communicator(std::shared_ptr<TcpStore> store, int rank, int size,
                                                      bool loopback, double timeout_seconds);

}  // namespace dlm::train
