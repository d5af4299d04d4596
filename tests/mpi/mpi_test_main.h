// A GoogleTest main for tests that run as every rank of an mpiexec (or of a torchrun): MPI for the process's lifetime,
// the world communicator for the tests, and one exit code for the job (any rank failing fails it).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "dlm/train/communicator.h"
#include "dlm/train/tcp_store.h"

namespace dlm::test {

// The world of the running mpiexec (valid inside tests); under torchrun its Gloo world.
train::Communicator& mpi_world();
// Under torchrun its c10d store (for NCCL worlds: nccl_communicator.h); null under mpiexec.
std::shared_ptr<train::TcpStore> torchrun_store();

}  // namespace dlm::test
