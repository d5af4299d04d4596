// MPI start-up and a collective work here: 4 ranks all-reduce their ranks and rank 0 reports.
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long local = rank + 1, sum = 0;
  MPI_Allreduce(&local, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  int ok = sum == static_cast<long>(size) * (size + 1) / 2;
  if (rank == 0) std::printf(ok ? "allreduce ok on %d ranks\n" : "allreduce WRONG on %d ranks\n", size);
  MPI_Finalize();
  return ok ? 0 : 1;
}
