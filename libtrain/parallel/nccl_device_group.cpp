// device_group.h over an NcclCommunicator: every operation enqueued on the model's stream (no host wait);
// complete() is the communicator's wait(), with its timeout and roll call.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/device_group.h"
#include "dlm/train/nccl_communicator.h"

namespace dlm::train {
namespace {

ncclDataType_t nccl_type(DeviceElement type) {
  return type == DeviceElement::kBF16 ? ncclBfloat16 : type == DeviceElement::kI32 ? ncclInt32 : ncclFloat32;
}
ncclComm_t comm_of(void* comm) { return static_cast<ncclComm_t>(comm); }
cudaStream_t stream_of(void* stream) { return static_cast<cudaStream_t>(stream); }

class NcclDeviceGroup final : public DeviceGroup {
 public:
  explicit NcclDeviceGroup(NcclCommunicator& nccl) : nccl_(nccl) {}
  int rank() const override { return nccl_.rank(); }
  int size() const override { return nccl_.size(); }
  const std::string& name() const override { return nccl_.name(); }

  void all_reduce(void* data, std::size_t count, DeviceElement type, void* stream) override {
    nccl_.enqueue("all_reduce", count * device_element_size(type), stream, [&](void* comm, void* s) {
      return static_cast<int>(ncclAllReduce(data, data, count, nccl_type(type), ncclSum, comm_of(comm), stream_of(s)));
    });
  }
  void all_gather(const void* in, void* out, std::size_t count, DeviceElement type, void* stream) override {
    nccl_.enqueue("all_gather", count * device_element_size(type), stream, [&](void* comm, void* s) {
      return static_cast<int>(ncclAllGather(in, out, count, nccl_type(type), comm_of(comm), stream_of(s)));
    });
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DeviceElement type, void* stream) override {
    nccl_.enqueue("reduce_scatter", count * size() * device_element_size(type), stream, [&](void* comm, void* s) {
      return static_cast<int>(ncclReduceScatter(in, out, count, nccl_type(type), ncclSum, comm_of(comm), stream_of(s)));
    });
  }
  void exchange(std::span<const Transfer> transfers, void* stream) override {
    if (transfers.empty()) return;
    std::size_t bytes = 0;
    std::string what;
    for (const Transfer& t : transfers) {
      bytes += t.count * device_element_size(t.type);
      what += fmt::format("{}{} rank {}", what.empty() ? "" : " + ", t.send ? "send to" : "recv from", nccl_.world_rank(t.peer));
    }
    nccl_.enqueue(what, bytes, stream, [&](void* comm, void* s) {
      ncclResult_t rc = ncclGroupStart();
      for (const Transfer& t : transfers) {
        if (rc != ncclSuccess) break;
        rc = t.send ? ncclSend(t.data, t.count, nccl_type(t.type), t.peer, comm_of(comm), stream_of(s))
                    : ncclRecv(t.data, t.count, nccl_type(t.type), t.peer, comm_of(comm), stream_of(s));
      }
      const ncclResult_t end = ncclGroupEnd();
      return static_cast<int>(rc != ncclSuccess ? rc : end);
    });
  }
  // One NCCL group of a send and a receive per peer with elements (the peer's own block included: NCCL pairs a
  // rank's send to itself with its receive from itself inside the group).
  void all_to_all_v(const void* in, std::span<const std::int64_t> send_counts, void* out,
                    std::span<const std::int64_t> recv_counts, DeviceElement type, void* stream) override {
    const std::size_t element = device_element_size(type), n = static_cast<std::size_t>(size());
    std::size_t bytes = 0;
    for (std::size_t r = 0; r < n; ++r) bytes += static_cast<std::size_t>(send_counts[r]) * element;
    nccl_.enqueue("all_to_all_v", bytes, stream, [&](void* comm, void* s) {
      ncclResult_t rc = ncclGroupStart();
      std::size_t send_at = 0, recv_at = 0;
      for (std::size_t r = 0; r < n && rc == ncclSuccess; ++r) {
        const auto peer = static_cast<int>(r);
        const auto sent = static_cast<std::size_t>(send_counts[r]), got = static_cast<std::size_t>(recv_counts[r]);
        if (sent > 0)
          rc = ncclSend(static_cast<const std::uint8_t*>(in) + send_at * element, sent, nccl_type(type), peer,
                        comm_of(comm), stream_of(s));
        if (rc == ncclSuccess && got > 0)
          rc = ncclRecv(static_cast<std::uint8_t*>(out) + recv_at * element, got, nccl_type(type), peer, comm_of(comm),
                        stream_of(s));
        send_at += sent, recv_at += got;
      }
      const ncclResult_t end = ncclGroupEnd();
      return static_cast<int>(rc != ncclSuccess ? rc : end);
    });
  }
  void complete() override { nccl_.wait(); }

 private:
  NcclCommunicator& nccl_;
};

}  // namespace

std::unique_ptr<DeviceGroup> nccl_device_group(Communicator& nccl) {
  auto* group = dynamic_cast<NcclCommunicator*>(&nccl);
  if (!group) fail(fmt::format("{} is not an NCCL communicator", nccl.name()));
  return std::make_unique<NcclDeviceGroup>(*group);
}

}  // namespace dlm::train
