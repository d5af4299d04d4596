// Gloo behind the communicator seam, meeting through the c10d store (see gloo_communicator.h).
#include "gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "dlm/train/tcp_store.h"
#include "roll_call.h"

namespace dlm::train {
namespace {

using Clock = RollCall::Clock;
using Milliseconds = std::chrono::milliseconds;

// Gloo's rendezvous keys in the c10d store.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(std::shared_ptr<TcpStore> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(data.data()), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    const auto v = store_->get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const Milliseconds& timeout) override {
    store_->wait(keys, std::chrono::duration<double>(timeout).count());
  }

 private:
  std::shared_ptr<TcpStore> store_;
};

// What a world and its groups share: the store, Gloo's device, the roll call.
struct Shared {
  std::shared_ptr<TcpStore> store;
  StoreAdapter adapter;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<RollCall> watch;
};

using ReduceFn = void (*)(void*, const void*, const void*, std::size_t);

template <typename T>
gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return static_cast<ReduceFn>(&gloo::max<T>);
    case ReduceOp::kMin: return static_cast<ReduceFn>(&gloo::min<T>);
    case ReduceOp::kSum: break;
  }
  return static_cast<ReduceFn>(&gloo::sum<T>);
}

// Calls f with a null pointer of `type`'s element type (Gloo's options are typed).
template <typename F>
void with_element(DataType type, F f) {
  switch (type) {
    case DataType::kFloat32: return f(static_cast<float*>(nullptr));
    case DataType::kFloat64: return f(static_cast<double*>(nullptr));
    case DataType::kInt32: return f(static_cast<std::int32_t*>(nullptr));
    case DataType::kInt64: return f(static_cast<std::int64_t*>(nullptr));
    case DataType::kUInt8: return f(static_cast<std::uint8_t*>(nullptr));
  }
}

// Point-to-point slots sit above Gloo's collectives' (whose prefixes are small numbers).
std::uint64_t p2p_slot(int tag) { return gloo::Slot::build(0xd1, static_cast<std::uint32_t>(tag + 1)); }

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Shared> shared, std::string id, std::vector<int> world_ranks, int rank, std::string name)
      : shared_(std::move(shared)), id_(std::move(id)), world_ranks_(std::move(world_ranks)), name_(std::move(name)) {
    const double total = shared_->watch->timeout_seconds();
    wait_ = Milliseconds(static_cast<long long>(1000 * std::max(0.8 * total, total - 30.0)));
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size());
    context->setTimeout(wait_);
    gloo::rendezvous::PrefixStore store(id_, shared_->adapter);
    guarded(fmt::format("connecting the {}", name_), 0, [&] {
      context->connectFullMesh(store, shared_->device);
      wait_for_every_member(store, rank);
    });
    context_ = std::move(context);
  }
  int rank() const override { return context_->rank; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  const std::string& name() const override { return name_; }
  int world_rank(int rank) const override { return world_ranks_.at(static_cast<std::size_t>(rank)); }

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    std::vector<int> world;
    int my_rank = 0;
    for (int r : split_members(color, key)) {
      if (r == rank()) my_rank = static_cast<int>(world.size());
      world.push_back(world_rank(r));
    }
    const std::string child = fmt::format("{}/split{}/{}", id_, splits_++, color);
    return std::make_unique<GlooCommunicator>(shared_, child, std::move(world), my_rank, std::move(name));
  }

 protected:
  void do_all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) override {
    if (count == 0) return;
    guarded("all_reduce", count * data_type_size(type), [&] {
      gloo::AllreduceOptions o(context_);
      with_element(type, [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        o.setOutput(static_cast<T*>(data), count);
        o.setReduceFunction(reduce_function<T>(op));
      });
      o.setTag(next_tag());
      o.setTimeout(wait_);
      gloo::allreduce(o);
    });
  }
  // An all-reduce of the whole input, of which this member keeps its block (the same sums as MPI's
  // reduce-scatter on two ranks; the CPU path's reduce-scatters are small).
  void do_reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op) override {
    const std::size_t block = count * data_type_size(type);
    std::vector<std::uint8_t> whole(static_cast<const std::uint8_t*>(in), static_cast<const std::uint8_t*>(in) + block * size());
    do_all_reduce(whole.data(), count * size(), type, op);
    std::memcpy(out, whole.data() + block * static_cast<std::size_t>(rank()), block);
  }
  void do_all_gather(const void* in, void* out, std::size_t count, DataType type) override {
    if (count == 0) return;
    const std::size_t bytes = count * data_type_size(type);
    guarded("all_gather", bytes, [&] {
      gloo::AllgatherOptions o(context_);
      o.setInput(const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(in)), bytes);
      o.setOutput(static_cast<std::uint8_t*>(out), bytes * size());
      o.setTag(next_tag());
      o.setTimeout(wait_);
      gloo::allgather(o);
    });
  }
  void do_all_to_all_v(const void* in, const std::int64_t* send, void* out, const std::int64_t* recv,
                       DataType type) override {
    const auto n = static_cast<std::size_t>(size());
    std::vector<std::int64_t> send_counts(send, send + n), recv_counts(recv, recv + n);
    std::int64_t send_total = 0, recv_total = 0;
    for (std::size_t r = 0; r < n; ++r) send_total += send_counts[r], recv_total += recv_counts[r];
    // Gloo's buffers need memory behind them even when nothing moves.
    std::uint8_t none[8] = {};
    void* input = send_total ? const_cast<void*>(in) : none;
    void* output = recv_total ? out : none;
    guarded("all_to_all_v", static_cast<std::size_t>(std::max(send_total, recv_total)) * data_type_size(type), [&] {
      gloo::AlltoallvOptions o(context_);
      with_element(type, [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        o.setInput(static_cast<T*>(input), send_counts);
        o.setOutput(static_cast<T*>(output), recv_counts);
      });
      o.setTag(next_tag());
      o.setTimeout(wait_);
      gloo::alltoallv(o);
    });
  }
  void do_broadcast(void* data, std::size_t count, DataType type, int root) override {
    if (count == 0) return;
    const std::size_t bytes = count * data_type_size(type);
    guarded("broadcast", bytes, [&] {
      gloo::BroadcastOptions o(context_);
      o.setOutput(static_cast<std::uint8_t*>(data), bytes);
      o.setRoot(root);
      o.setTag(next_tag());
      o.setTimeout(wait_);
      gloo::broadcast(o);
    });
  }
  void do_barrier() override {
    guarded("barrier", 0, [&] {
      gloo::BarrierOptions o(context_);
      o.setTag(next_tag());
      o.setTimeout(wait_);
      gloo::barrier(o);
    });
  }
  void do_send(const void* data, std::size_t count, DataType type, int peer) override {
    do_send_async(data, count, type, peer, -1);
    do_wait_sends();
  }
  void do_recv(void* data, std::size_t count, DataType type, int peer) override { do_recv_tagged(data, count, type, peer, -1); }
  void do_send_async(const void* data, std::size_t count, DataType type, int peer, int tag) override {
    const std::size_t bytes = count * data_type_size(type);
    if (bytes == 0) return;
    const std::string what = fmt::format("send to rank {}", world_rank(peer));
    guarded(what, bytes, [&] {
      auto buffer = context_->createUnboundBuffer(const_cast<void*>(data), bytes);
      buffer->send(peer, p2p_slot(checked_tag(tag)));
      sends_.push_back({std::move(buffer), what});
    });
  }
  void do_recv_tagged(void* data, std::size_t count, DataType type, int peer, int tag) override {
    const std::size_t bytes = count * data_type_size(type);
    if (bytes == 0) return;
    guarded(fmt::format("recv from rank {}", world_rank(peer)), bytes, [&] {
      auto buffer = context_->createUnboundBuffer(data, bytes);
      buffer->recv(peer, p2p_slot(checked_tag(tag)));
      buffer->waitRecv(wait_);
    });
  }
  void do_wait_sends() override {
    auto sends = std::move(sends_);
    sends_.clear();
    for (auto& s : sends) guarded(s.what, s.buffer->size, [&] { s.buffer->waitSend(wait_); });
  }

 private:
  struct PendingSend {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    std::string what;
  };
  static int checked_tag(int tag) {
    if (tag < -1 || tag > 30000) fail(fmt::format("a point-to-point tag {} outside [0, 30000]", tag));
    return tag;
  }
  std::uint32_t next_tag() { return tag_++; }

  // Runs one Gloo operation; Gloo's error (its timeout, or a peer that closed) becomes the roll call's verdict.
  template <typename Body>
  void guarded(const std::string& what, std::size_t bytes, Body body) {
    RollCall& w = *shared_->watch;
    const long long op = w.next_operation();
    const auto begin = Clock::now();
    try {
      body();
    } catch (const gloo::Exception& e) {
      const bool late = Clock::now() - begin >= wait_;
      const std::string problem =
          late ? fmt::format("did not complete within {:g} min (--distributed-timeout-minutes)", w.timeout_seconds() / 60)
               : fmt::format("failed: {}", first_line(e.what()));
      const auto deadline = begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(w.timeout_seconds()));
      throw CommunicationError(fmt::format("{} #{} of {} bytes on the {} {}: {}", what, op, bytes, name_, problem,
                                           w.verdict(world_ranks_, deadline)));
    }
  }
  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

  // Connecting is over for a member only once it is over for all. The connecting side of a Gloo pair counts it
  // connected when the peer's kernel completes the handshake, before the peer has taken it up; a member that went
  // on at once and closed the group (a refusal that every rank makes right after connecting) would close pairs
  // under a peer still connecting, whose connect then fails with "Connection closed by peer" in place of its own
  // refusal. The store, not the pairs, carries this last step, so a member's exit cannot break it.
  void wait_for_every_member(gloo::rendezvous::Store& store, int rank) const {
    store.set(fmt::format("connected/{}", rank), {});
    std::vector<std::string> all;
    for (int r = 0; r < size(); ++r) all.push_back(fmt::format("connected/{}", r));
    store.wait(all, wait_);
  }

  std::shared_ptr<Shared> shared_;
  std::string id_;
  std::vector<int> world_ranks_;
  std::string name_;
  std::shared_ptr<gloo::Context> context_;
  Milliseconds wait_{0};
  std::uint32_t tag_ = 0;
  int splits_ = 0;
  std::vector<PendingSend> sends_;
};

}  // namespace

std::unique_ptr<Communicator> gloo_world_communicator(std::shared_ptr<TcpStore> store, int rank, int size,
                                                      bool loopback, double timeout_seconds) {
  gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface) attr.iface = iface;
  else if (loopback) attr.hostname = "127.0.0.1";
  auto watch = store_roll_call(store->host(), store->port(), store->prefix() + "gloo/", rank, size, timeout_seconds);
  auto shared = std::make_shared<Shared>(Shared{store, StoreAdapter(store), gloo::transport::tcp::CreateDevice(attr), std::move(watch)});
  std::vector<int> world(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) world[static_cast<std::size_t>(r)] = r;
  return std::make_unique<GlooCommunicator>(std::move(shared), "gloo/world", std::move(world), rank,
                                            fmt::format("world ({} ranks)", size));
}

}  // namespace dlm::train
