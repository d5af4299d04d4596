// The NCCL implementation of the communicator seam (CUDA backend): every data pointer is device memory.
//
// Start-up goes through MPI (mpi_communicator.h): the MPI world gives rank and size, rank 0's
// ncclUniqueId is broadcast over it, and the process takes the GPU of its local rank. The groups of
// process_groups.cpp are split from the NCCL world with ncclCommSplit.
//
// Timeouts: the communicators are non-blocking (ncclCommInitRankConfig with blocking = 0), so no NCCL
// call ever waits on a peer; an operation is enqueued on the communicator's stream and the host polls
// cudaStreamQuery and ncclCommGetAsyncError against --distributed-timeout-minutes. A missed deadline
// (80% of the timeout, at least the timeout less 30 s) or an asynchronous NCCL error starts a roll call
// over MPI (over the c10d store under torchrun), as the MPI communicator holds one: every member of the
// group is pinged, the live ones answer (from their own polling loops; under torchrun from a thread of
// their own), and those silent when the timeout is over are named. The communicator is
// then aborted (ncclCommAbort, which also stops its kernels) and CommunicationError thrown:
//   "all_reduce #12 of 1342177280 bytes on the data-parallel group (world ranks 0,1) did not complete
//    within 0.5 min (--distributed-timeout-minutes): rank 1 did not answer (dead or hung)"
//
// Ordering with compute: the seam's operations return when the transfer is complete. They run on the
// communicator's own stream, so the data must be ready when they are called (the producer's stream
// synchronized), or use_stream() puts them behind the caller's kernels. For overlap, all_reduce_async
// only enqueues (after an optional event wait on another stream) and wait() completes everything
// enqueued, with the same timeout. Never block on a stream that holds NCCL work (cudaStreamSynchronize
// would wait forever for a dead peer): wait() is the only safe way to finish it.
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "dlm/train/communicator.h"

namespace dlm::train {

class TcpStore;

class NcclCommunicator final : public Communicator {
 public:
  struct Shared;  // the roll call and operation counter of a world and its groups
  struct State;   // one ncclComm_t, its stream and its members
  NcclCommunicator(std::shared_ptr<Shared> shared, std::unique_ptr<State> state);
  ~NcclCommunicator() override;  // ncclCommDestroy, or ncclCommAbort after a failure

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  int world_rank(int rank) const override;
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;

  // The cudaStream_t the operations are enqueued on (void* keeps CUDA's headers out of this one).
  void* stream() const;
  // Enqueue on `stream` (a cudaStream_t the caller owns) from now on, behind its kernels.
  void use_stream(void* stream);
  // Enqueues an in-place sum (or op) of device data; returns at once. If `after` (a cudaEvent_t) is given
  // the reduction waits on the device for it (a bucket's last gradient kernel on the model's stream).
  template <typename T>
  void all_reduce_async(std::span<T> data, ReduceOp op = ReduceOp::kSum, void* after = nullptr) {
    enqueue_all_reduce(data.data(), data.size(), data_type_of<T>(), op, after);
  }
  // Every operation enqueued so far has completed; CommunicationError naming the lost rank otherwise.
  void wait();
  // Enqueues what `call` posts (one NCCL call, or a group of them) on `stream` (a cudaStream_t, which
  // becomes this communicator's stream) and returns at once; wait() completes it. `call` gets the
  // ncclComm_t and the stream and returns the ncclResult_t (as int). For device_group.h's NCCL groups.
  void enqueue(const std::string& what, std::size_t bytes, void* stream, const std::function<int(void*, void*)>& call);

 protected:
  void do_all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) override;
  void do_reduce_scatter(const void* input, void* output, std::size_t count, DataType type, ReduceOp op) override;
  void do_all_gather(const void* input, void* output, std::size_t count, DataType type) override;
  void do_broadcast(void* data, std::size_t count, DataType type, int root) override;
  void do_barrier() override;
  // Device pointers; a grouped ncclSend/ncclRecv per peer (NCCL has no all-to-all-v of its own).
  void do_all_to_all_v(const void* input, const std::int64_t* send_counts, void* output, const std::int64_t* recv_counts,
                       DataType type) override;
  void do_send(const void* data, std::size_t count, DataType type, int peer) override;
  void do_recv(void* data, std::size_t count, DataType type, int peer) override;

 private:
  void enqueue_all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, void* after);
  void enqueued(const std::string& what, std::size_t bytes, const std::function<int()>& post);
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<State> state_;
};

// Collective over the MPI world: takes GPU `device` (the launcher's local rank), creates the NCCL world
// from rank 0's unique id broadcast over `mpi_world`, and a roll-call communicator of its own (a duplicate
// of MPI_COMM_WORLD). MPI must be initialized (MpiSession) for the lifetime of the result and its groups.
// Under torchrun (`store` given; `mpi_world` is then the Gloo world, torchrun.h): the unique id goes through
// the c10d store (rank 0 sets it, the others wait for it) and so does the roll call; no MPI is involved.
std::unique_ptr<NcclCommunicator> nccl_world_communicator(Communicator& mpi_world, int device, double timeout_seconds,
                                                         const std::shared_ptr<TcpStore>& store = nullptr);

}  // namespace dlm::train
