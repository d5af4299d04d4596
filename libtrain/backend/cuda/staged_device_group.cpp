// device_group.h through host memory: each operation synchronizes the stream, copies the device data to the
// host as fp32, runs the host communicator's collective (MPI) and copies the result back. Slow, but it runs
// every layout with several ranks on one GPU (NCCL refuses two ranks on one device), which is what the
// tests of the layouts need; bf16 sums add in fp32 and round once, as NCCL's do.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <vector>

#include "dlm/train/communicator.h"
#include "dlm/train/device_group.h"
#include "kernels.h"

namespace dlm::train {
namespace {

using cuda::check_cuda;

class StagedDeviceGroup final : public DeviceGroup {
 public:
  explicit StagedDeviceGroup(Communicator& host) : host_(host) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  const std::string& name() const override { return host_.name(); }

  void all_reduce(void* data, std::size_t count, DeviceElement type, void* stream) override {
    std::vector<float> v = download(data, count, type, stream);
    host_.all_reduce(std::span<float>(v));
    upload(v, data, type, stream);
  }
  void all_gather(const void* in, void* out, std::size_t count, DeviceElement type, void* stream) override {
    const std::vector<float> mine = download(in, count, type, stream);
    std::vector<float> all(count * static_cast<std::size_t>(size()));
    host_.all_gather(std::span<const float>(mine), std::span<float>(all));
    upload(all, out, type, stream);
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DeviceElement type, void* stream) override {
    const std::vector<float> all = download(in, count * static_cast<std::size_t>(size()), type, stream);
    std::vector<float> mine(count);
    host_.reduce_scatter(std::span<const float>(all), std::span<float>(mine));
    upload(mine, out, type, stream);
  }
  // Sends go first (asynchronous), then the blocking receives: no order of the peers' calls deadlocks.
  void exchange(std::span<const Transfer> transfers, void* stream) override {
    std::vector<std::vector<float>> sent;
    sent.reserve(transfers.size());
    for (const Transfer& t : transfers)
      if (t.send) host_.send_async<float>(sent.emplace_back(download(t.data, t.count, t.type, stream)), t.peer, 0);
    for (const Transfer& t : transfers) {
      if (t.send) continue;
      std::vector<float> v(t.count);
      host_.recv<float>(v, t.peer, 0);
      upload(v, t.data, t.type, stream);
    }
    host_.wait_sends();
  }
  void complete() override {}

 private:
  static std::vector<float> download(const void* data, std::size_t count, DeviceElement type, void* stream) {
    const auto st = static_cast<cudaStream_t>(stream);
    std::vector<float> v(count);
    if (type == DeviceElement::kF32) {
      check_cuda(cudaMemcpyAsync(v.data(), data, count * 4, cudaMemcpyDeviceToHost, st), "staged group");
      check_cuda(cudaStreamSynchronize(st), "staged group");
      return v;
    }
    std::vector<__nv_bfloat16> h(count);
    check_cuda(cudaMemcpyAsync(h.data(), data, count * 2, cudaMemcpyDeviceToHost, st), "staged group");
    check_cuda(cudaStreamSynchronize(st), "staged group");
    for (std::size_t i = 0; i < count; ++i) v[i] = __bfloat162float(h[i]);
    return v;
  }
  static void upload(const std::vector<float>& v, void* data, DeviceElement type, void* stream) {
    const auto st = static_cast<cudaStream_t>(stream);
    if (type == DeviceElement::kF32) {
      check_cuda(cudaMemcpyAsync(data, v.data(), v.size() * 4, cudaMemcpyHostToDevice, st), "staged group");
    } else {
      std::vector<__nv_bfloat16> h(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) h[i] = __float2bfloat16_rn(v[i]);
      check_cuda(cudaMemcpyAsync(data, h.data(), h.size() * 2, cudaMemcpyHostToDevice, st), "staged group");
      check_cuda(cudaStreamSynchronize(st), "staged group");  // h goes out of scope
      return;
    }
    check_cuda(cudaStreamSynchronize(st), "staged group");
  }

  Communicator& host_;
};

}  // namespace

std::unique_ptr<DeviceGroup> staged_device_group(Communicator& host) { return std::make_unique<StagedDeviceGroup>(host); }

}  // namespace dlm::train
