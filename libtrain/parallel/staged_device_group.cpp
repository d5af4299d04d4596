// device_group.h through host memory (see staged_device_group.h). Each operation copies its data to the host
// as fp32 (bf16 widened), runs the host communicator's operation and copies the result back: reductions add
// in fp32 and round once, as NCCL's bf16 sums do. Point-to-point transfers and all-to-alls carry the bytes as they are.
#include "staged_device_group.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/communicator.h"

namespace dlm::train {
namespace {

float bf16_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }
std::uint16_t float_to_bf16(float f) {  // round to nearest even (finite values)
  const auto u = std::bit_cast<std::uint32_t>(f);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

class StagedDeviceGroup final : public DeviceGroup {
 public:
  StagedDeviceGroup(Communicator& host, StagingCopies copies) : host_(host), copies_(copies) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  const std::string& name() const override { return host_.name(); }

  void all_reduce(void* data, std::size_t count, DeviceElement type, void* stream) override {
    std::vector<float> v = widen(data, count, type, stream);
    host_.all_reduce(std::span<float>(v));
    narrow(v, data, type, stream);
  }
  void all_gather(const void* in, void* out, std::size_t count, DeviceElement type, void* stream) override {
    const std::vector<float> mine = widen(in, count, type, stream);
    std::vector<float> all(count * static_cast<std::size_t>(size()));
    host_.all_gather(std::span<const float>(mine), std::span<float>(all));
    narrow(all, out, type, stream);
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DeviceElement type, void* stream) override {
    const std::vector<float> all = widen(in, count * static_cast<std::size_t>(size()), type, stream);
    std::vector<float> mine(count);
    host_.reduce_scatter(std::span<const float>(all), std::span<float>(mine));
    narrow(mine, out, type, stream);
  }
  // NCCL's semantics, which the pipeline's pairing must respect: the call returns once every transfer in it
  // has met its peer's, and a send completes only when its receiver has posted the receive (an MPI send of
  // a small message would complete on its own and hide a mis-paired schedule). So: sends posted, receives
  // completed and each acknowledged, then each send's acknowledgement awaited.
  void exchange(std::span<const Transfer> transfers, void* stream) override {
    constexpr int kData = 0, kAck = 1;
    std::vector<std::vector<std::uint8_t>> sent;
    sent.reserve(2 * transfers.size());
    for (const Transfer& t : transfers) {
      if (!t.send) continue;
      auto& bytes = sent.emplace_back(t.count * device_element_size(t.type));
      copies_.to_host(bytes.data(), t.data, bytes.size(), stream);
      host_.send_async<std::uint8_t>(bytes, t.peer, kData);
    }
    for (const Transfer& t : transfers) {
      if (t.send) continue;
      std::vector<std::uint8_t> bytes(t.count * device_element_size(t.type));
      host_.recv<std::uint8_t>(bytes, t.peer, kData);
      copies_.to_device(t.data, bytes.data(), bytes.size(), stream);
      host_.send_async<std::uint8_t>(sent.emplace_back(1, std::uint8_t{1}), t.peer, kAck);
    }
    for (const Transfer& t : transfers) {
      if (!t.send) continue;
      std::uint8_t ack = 0;
      host_.recv<std::uint8_t>(std::span<std::uint8_t>(&ack, 1), t.peer, kAck);
    }
    host_.wait_sends();
  }
  // The blocks to the host, the host's all-to-all-v of their bytes, the result back.
  void all_to_all_v(const void* in, std::span<const std::int64_t> send_counts, void* out,
                    std::span<const std::int64_t> recv_counts, DeviceElement type, void* stream) override {
    const auto element = static_cast<std::int64_t>(device_element_size(type));
    std::vector<std::int64_t> send_bytes(send_counts.begin(), send_counts.end()),
        recv_bytes(recv_counts.begin(), recv_counts.end());
    for (auto& b : send_bytes) b *= element;
    for (auto& b : recv_bytes) b *= element;
    std::vector<std::uint8_t> sent(static_cast<std::size_t>(std::accumulate(send_bytes.begin(), send_bytes.end(), std::int64_t{0}))),
        got(static_cast<std::size_t>(std::accumulate(recv_bytes.begin(), recv_bytes.end(), std::int64_t{0})));
    if (!sent.empty()) copies_.to_host(sent.data(), in, sent.size(), stream);
    host_.all_to_all_v<std::uint8_t>(sent, send_bytes, got, recv_bytes);
    if (!got.empty()) copies_.to_device(out, got.data(), got.size(), stream);
  }
  void complete() override {}

 private:
  std::vector<float> widen(const void* data, std::size_t count, DeviceElement type, void* stream) const {
    if (type == DeviceElement::kI32) fail(fmt::format("{}: no reduction of int32 elements staged through the host", name()));
    std::vector<float> v(count);
    if (type == DeviceElement::kF32) {
      copies_.to_host(v.data(), data, count * 4, stream);
      return v;
    }
    std::vector<std::uint16_t> h(count);
    copies_.to_host(h.data(), data, count * 2, stream);
    for (std::size_t i = 0; i < count; ++i) v[i] = bf16_to_float(h[i]);
    return v;
  }
  void narrow(const std::vector<float>& v, void* data, DeviceElement type, void* stream) const {
    if (type == DeviceElement::kF32) return copies_.to_device(data, v.data(), v.size() * 4, stream);
    std::vector<std::uint16_t> h(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]);
    copies_.to_device(data, h.data(), h.size() * 2, stream);
  }

  Communicator& host_;
  StagingCopies copies_;
};

void copy_bytes(void* dst, const void* src, std::size_t bytes, void*) { std::memcpy(dst, src, bytes); }

}  // namespace

std::unique_ptr<DeviceGroup> make_staged_group(Communicator& host, StagingCopies copies) {
  return std::make_unique<StagedDeviceGroup>(host, copies);
}

std::unique_ptr<DeviceGroup> host_device_group(Communicator& host) {
  return make_staged_group(host, {copy_bytes, copy_bytes});
}

}  // namespace dlm::train
