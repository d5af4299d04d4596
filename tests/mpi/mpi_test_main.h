// A GoogleTest main for tests that run as every rank of an mpiexec: MPI for the process's lifetime,
// the world communicator for the tests, and one exit code for the job (any rank failing fails it).
#pragma once

#include <gtest/gtest.h>

#include "dlm/train/communicator.h"

namespace dlm::test {

// The world of the running mpiexec (valid inside tests).
train::Communicator& mpi_world();

}  // namespace dlm::test
