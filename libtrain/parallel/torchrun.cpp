// Joining torchrun's ranks: the agent's c10d store, then the Gloo world over it (see torchrun.h).
#include "dlm/train/torchrun.h"

#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "dlm/common/error.h"
#ifdef DLM_HAVE_GLOO
#include "gloo_communicator.h"
#endif

namespace dlm::train {
namespace {

std::string variable(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

TorchrunWorld join_torchrun(const LaunchInfo& launch, double timeout_seconds) {
  const std::string host = variable("MASTER_ADDR"), port_text = variable("MASTER_PORT");
  if (host.empty() || port_text.empty())
    fail(fmt::format("rank {}: torchrun's MASTER_ADDR and MASTER_PORT are not both set", launch.rank));
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) fail(fmt::format("MASTER_PORT={}: not a port", port_text));
  // torch 1.x's torchrun left the store to rank 0 of the workers; dlm is only a client of the agent's.
  if (const std::string agent = variable("TORCHELASTIC_USE_AGENT_STORE"); agent != "True")
    fail(fmt::format("TORCHELASTIC_USE_AGENT_STORE={}: dlm-train joins the c10d store of torchrun's agent (torch 2.x's "
                     "torchrun), not one hosted by a worker; launch with torch 2's torchrun, mpirun or srun",
                     agent.empty() ? "(unset)" : agent));
  const std::string attempt = variable("TORCHELASTIC_RESTART_COUNT");
  TorchrunWorld w;
  w.store = std::make_shared<TcpStore>(host, static_cast<int>(port),
                                       fmt::format("/worker/attempt_{}/dlm/", attempt.empty() ? "0" : attempt),
                                       timeout_seconds, fmt::format("rank {}", launch.rank));
#ifdef DLM_HAVE_GLOO
  const std::string local_size = variable("LOCAL_WORLD_SIZE");
  const bool one_host = !local_size.empty() && std::atoi(local_size.c_str()) == launch.world_size;
  w.world = gloo_world_communicator(w.store, launch.rank, launch.world_size, one_host, timeout_seconds);
#else
  fail("torchrun: this build of dlm has no Gloo (libgloo-dev) for the ranks' host collectives; rebuild with it, or "
       "launch with mpirun -np N or srun");
#endif
  return w;
}

}  // namespace dlm::train
