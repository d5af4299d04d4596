// A group of GPUs as the CUDA backend's model-parallel layers see it: collectives and pipeline transfers
// on device memory, ENQUEUED on the caller's stream behind the kernels that produce their data, so a
// tensor-parallel layer never waits on the host. Nothing here blocks; complete() is where the host waits
// (with the group's timeout, naming a lost rank) once a step's work is enqueued.
//
// Implementations: NCCL (nccl_communicator.h: one GPU per rank, the production path), and groups that stage
// through host memory over any Communicator (MPI): with CUDA copies several ranks share one GPU (the tests
// run every layout on a one-GPU machine, at host speed); over plain host memory the pipeline schedule's
// tests run on CPUs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace dlm::train {

class Communicator;

// kI32 travels in transfers and all-to-alls only (the MoE dispatch's counts); the reductions take kF32 and kBF16.
enum class DeviceElement { kF32, kBF16, kI32 };
std::size_t device_element_size(DeviceElement type);

class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;

  // Sums (bf16 sums add in fp32 and round once, as NCCL does). `stream` is a cudaStream_t.
  virtual void all_reduce(void* data, std::size_t count, DeviceElement type, void* stream) = 0;
  // out holds size() blocks of `count`, member r's input at block r.
  virtual void all_gather(const void* in, void* out, std::size_t count, DeviceElement type, void* stream) = 0;
  // in holds size() blocks of `count`; member r gets the sum of block r.
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DeviceElement type, void* stream) = 0;
  // Point-to-point transfers posted together (NCCL's group call): a stage that sends to one neighbour while it
  // receives from another (or the same) cannot deadlock against it, whatever order the two post in.
  struct Transfer {
    bool send = true;
    void* data = nullptr;
    std::size_t count = 0;
    DeviceElement type = DeviceElement::kF32;
    int peer = 0;  // group rank
  };
  virtual void exchange(std::span<const Transfer> transfers, void* stream) = 0;
  // All-to-all with a size per pair (MPI's alltoallv): `in` holds size() blocks in member order, block r of
  // send_counts[r] elements going to member r; `out` receives block r (recv_counts[r] elements) from member r,
  // blocks in member order. The counts are the host's and must match the peers' (the expert dispatch exchanges
  // them first); the bytes travel as they are.
  virtual void all_to_all_v(const void* in, std::span<const std::int64_t> send_counts, void* out,
                            std::span<const std::int64_t> recv_counts, DeviceElement type, void* stream) = 0;

  // Every operation enqueued so far has completed (CommunicationError naming the lost rank after the timeout).
  virtual void complete() = 0;
};

// The NCCL group behind `nccl` (an NcclCommunicator; dlm::Error for another, or without NCCL in this build).
// `nccl` must outlive the result.
std::unique_ptr<DeviceGroup> nccl_device_group(Communicator& nccl);
// Device memory staged through the host over `host` (MPI): the stream is synchronized around each operation.
// For tests of the parallel layouts on one GPU (CUDA builds only); `host` must outlive the result.
std::unique_ptr<DeviceGroup> staged_device_group(Communicator& host);
// "Device" memory that is host memory, over `host`: the schedules' tests on CPUs.
std::unique_ptr<DeviceGroup> host_device_group(Communicator& host);

}  // namespace dlm::train
