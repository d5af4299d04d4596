// The NCCL communicator under mpiexec, one GPU per rank: every collective's result in device memory,
// send/recv along a ring, the groups of each layout split with ncclCommSplit (Megatron's members), the
// asynchronous all-reduce behind an event, the device group's all-to-all-v, and a rank that stops calling named
// within the timeout.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "dlm/train/device_group.h"
#include "dlm/train/nccl_communicator.h"
#include "dlm/train/parallel.h"
#include "mpi_test_main.h"

namespace dlm::train {
namespace {

using test::mpi_world;
using test::torchrun_store;

// Device memory holding a copy of a host vector.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<std::size_t>(n_, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DeviceVector(std::size_t n) : DeviceVector(std::vector<T>(n)) {}
  ~DeviceVector() { cudaFree(p_); }
  std::span<T> span() { return {p_, n_}; }
  std::vector<T> host() const {
    std::vector<T> out(n_);
    EXPECT_EQ(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

// True on every rank when every rank has a GPU of its own (decided together, so all skip or none).
bool have_gpus() {
  static const bool ok = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    int mine = launch_info_from_environment().local_rank < count ? 1 : 0;
    mpi_world().all_reduce(std::span<int>(&mine, 1), ReduceOp::kMin);
    return mine == 1;
  }();
  return ok;
}

NcclCommunicator& world() {
  // Never destroyed: it would outlive MPI (the test main finalizes before static destructors run).
  static NcclCommunicator* w =
      nccl_world_communicator(mpi_world(), launch_info_from_environment().local_rank, 60.0, torchrun_store()).release();
  return *w;
}

#define REQUIRE_GPUS()                                                         \
  if (!have_gpus()) GTEST_SKIP() << "needs one GPU per rank";                  \
  static_cast<void>(0)

TEST(NcclCommunicator, WorldMatchesMpi) {
  REQUIRE_GPUS();
  EXPECT_EQ(world().rank(), mpi_world().rank());
  EXPECT_EQ(world().size(), mpi_world().size());
  for (int r = 0; r < world().size(); ++r) EXPECT_EQ(world().world_rank(r), r);
}

TEST(NcclCommunicator, AllReduceSumMaxMinOfEveryType) {
  REQUIRE_GPUS();
  const int n = world().size(), r = world().rank();
  DeviceVector<float> f(std::vector<float>{float(r + 1), -float(r), 0.5f});
  world().all_reduce(f.span());
  EXPECT_EQ(f.host(), (std::vector<float>{float(n * (n + 1) / 2), -float(n * (n - 1) / 2), 0.5f * n}));
  DeviceVector<double> d(std::vector<double>{double(r), 1e300 * (r == 0)});
  world().all_reduce(d.span(), ReduceOp::kMax);
  EXPECT_EQ(d.host(), (std::vector<double>{double(n - 1), 1e300}));
  DeviceVector<std::int32_t> i(std::vector<std::int32_t>{r + 5, -r});
  world().all_reduce(i.span(), ReduceOp::kMin);
  EXPECT_EQ(i.host(), (std::vector<std::int32_t>{5, -(n - 1)}));
  DeviceVector<std::int64_t> l(std::vector<std::int64_t>{std::int64_t{1} << 40});
  world().all_reduce(l.span());
  EXPECT_EQ(l.host()[0], std::int64_t{n} << 40);
  DeviceVector<std::uint8_t> u(std::vector<std::uint8_t>{std::uint8_t(r + 1)});
  world().all_reduce(u.span(), ReduceOp::kMax);
  EXPECT_EQ(u.host()[0], n);
}

TEST(NcclCommunicator, ReduceScatterAllGatherBroadcastBarrier) {
  REQUIRE_GPUS();
  const int n = world().size(), r = world().rank();
  // Block b of member r's input holds 10 b + r: block b of the sum is 10 b n + n (n - 1) / 2.
  std::vector<float> input;
  for (int b = 0; b < n; ++b) input.insert(input.end(), {float(10 * b + r), 1.0f});
  DeviceVector<float> in(input), out(std::size_t{2});
  world().reduce_scatter<float>(in.span(), out.span());
  EXPECT_EQ(out.host(), (std::vector<float>{float(10 * r * n + n * (n - 1) / 2), float(n)}));

  DeviceVector<std::int64_t> mine(std::vector<std::int64_t>{r, 100 + r}), all(std::size_t(2 * n));
  world().all_gather<std::int64_t>(mine.span(), all.span());
  std::vector<std::int64_t> expected;
  for (int b = 0; b < n; ++b) expected.insert(expected.end(), {b, 100 + b});
  EXPECT_EQ(all.host(), expected);

  const int root = n - 1;
  DeviceVector<double> value(std::vector<double>{r == root ? 3.25 : -1.0, double(r == root)});
  world().broadcast(value.span(), root);
  EXPECT_EQ(value.host(), (std::vector<double>{3.25, 1.0}));
  world().barrier();
}

TEST(NcclCommunicator, SendRecvAlongARing) {
  REQUIRE_GPUS();
  const int n = world().size(), r = world().rank();
  if (n < 2) GTEST_SKIP() << "a ring needs two ranks";
  DeviceVector<float> out(std::vector<float>(1000, float(r))), in(std::size_t{1000});
  // Even ranks send first, odd ranks receive first: no rank waits on a peer that waits on it.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {
    world().send<float>(out.span(), next);
    world().recv(in.span(), prev);
  } else {
    world().recv(in.span(), prev);
    world().send<float>(out.span(), next);
  }
  EXPECT_EQ(in.host(), std::vector<float>(1000, float(prev)));
}

TEST(NcclCommunicator, GroupsOfEveryLayoutHoldMegatronsMembers) {
  REQUIRE_GPUS();
  const int n = world().size(), r = world().rank();
  for (int tensor = 1; tensor <= n; tensor *= 2)
    for (int pipeline = 1; tensor * pipeline <= n; pipeline *= 2) {
      if (n % (tensor * pipeline) != 0) continue;
      SCOPED_TRACE(testing::Message() << "TP " << tensor << " PP " << pipeline);
      const ParallelConfig config = derive_parallel_config(n, tensor, pipeline);
      ProcessGroups g = make_process_groups(world(), config);
      const std::pair<Communicator*, std::vector<int>> groups[] = {
          {g.tensor.get(), tensor_parallel_ranks(config, r)},
          {g.data.get(), data_parallel_ranks(config, r)},
          {g.pipeline.get(), pipeline_parallel_ranks(config, r)}};
      for (const auto& [group, members] : groups) {
        ASSERT_EQ(group->size(), static_cast<int>(members.size()));
        std::vector<int> world_ranks;
        for (int k = 0; k < group->size(); ++k) world_ranks.push_back(group->world_rank(k));
        EXPECT_EQ(world_ranks, members) << group->name();
        EXPECT_EQ(group->world_rank(group->rank()), r);
        // The group's collectives reach exactly its members: the sum of their world ranks.
        DeviceVector<std::int32_t> x(std::vector<std::int32_t>{r});
        group->all_reduce(x.span());
        EXPECT_EQ(x.host()[0], std::accumulate(members.begin(), members.end(), 0)) << group->name();
      }
    }
}

TEST(NcclCommunicator, AsyncAllReduceWaitsForTheProducersEvent) {
  REQUIRE_GPUS();
  const int n = world().size(), r = world().rank();
  // The producer fills the buffer on a stream of its own; the reduction waits for its event on the device.
  cudaStream_t producer;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t ready;
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  std::vector<std::unique_ptr<DeviceVector<float>>> buckets;
  const std::vector<float> host(1 << 20, float(r + 1));
  for (int b = 0; b < 4; ++b) {
    buckets.push_back(std::make_unique<DeviceVector<float>>(std::size_t{1} << 20));
    ASSERT_EQ(cudaMemcpyAsync(buckets.back()->span().data(), host.data(), host.size() * 4, cudaMemcpyHostToDevice, producer),
              cudaSuccess);
    ASSERT_EQ(cudaEventRecord(ready, producer), cudaSuccess);
    world().all_reduce_async(buckets.back()->span(), ReduceOp::kSum, ready);
  }
  world().wait();
  for (const auto& b : buckets) EXPECT_EQ(b->host(), std::vector<float>(1 << 20, float(n * (n + 1) / 2)));
  cudaEventDestroy(ready);
  cudaStreamDestroy(producer);
}

// The device group's all-to-all-v (device_group.h, the GPU expert dispatch's) as NCCL's grouped send/recv on the
// caller's stream: rank r's block for rank s is s + 1 int32 values 1000 r + s, its own block included; rank r
// receives r + 1 values from each rank in rank order.
TEST(NcclCommunicator, DeviceGroupAllToAllVPairsEveryBlock) {
  REQUIRE_GPUS();
  const int n = world().size(), r = world().rank();
  auto group = nccl_device_group(world());
  std::vector<std::int64_t> counts(static_cast<std::size_t>(n)), mine(static_cast<std::size_t>(n), r + 1);
  std::iota(counts.begin(), counts.end(), 1);
  std::vector<std::int32_t> blocks, expected;
  for (int s = 0; s < n; ++s) blocks.resize(blocks.size() + static_cast<std::size_t>(s + 1), 1000 * r + s);
  for (int q = 0; q < n; ++q) expected.resize(expected.size() + static_cast<std::size_t>(r + 1), 1000 * q + r);
  DeviceVector<std::int32_t> in(blocks), out(expected.size());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  group->all_to_all_v(in.span().data(), counts, out.span().data(), mine, DeviceElement::kI32, stream);
  group->complete();
  EXPECT_EQ(out.host(), expected);
  cudaStreamDestroy(stream);
}

// Runs last (the name sorts after the others is not relied on: it uses a world of its own).
TEST(NcclCommunicator, ZZARankThatStopsCallingIsNamedWithinTheTimeout) {
  REQUIRE_GPUS();
  const int n = world().size(), r = world().rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  constexpr double kTimeout = 4.0;
  auto w = nccl_world_communicator(mpi_world(), launch_info_from_environment().local_rank, kTimeout, torchrun_store());
  DeviceVector<float> x(std::vector<float>(256, 1.0f));
  w->all_reduce(x.span());  // connections up before the test
  const int hung = n - 1;
  if (r == hung) {
    // Neither calls the collective nor answers pings, as a hung process.
    std::this_thread::sleep_for(std::chrono::duration<double>(kTimeout + 2.0));
  } else {
    const auto begin = std::chrono::steady_clock::now();
    try {
      w->all_reduce(x.span());
      ADD_FAILURE() << "the all-reduce completed without rank " << hung;
    } catch (const CommunicationError& e) {
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      const std::string message = e.what();
      // Under torchrun a thread answers the store's roll call for the sleeping rank: alive, at an earlier
      // operation than the caller's.
      const std::string named = torchrun_store() ? "every member answered (rank " + std::to_string(hung) + " at operation #"
                                                 : "rank " + std::to_string(hung) + " did not answer (dead or hung)";
      EXPECT_NE(message.find(named), std::string::npos) << message;
      EXPECT_NE(message.find("all_reduce #"), std::string::npos) << message;
      EXPECT_NE(message.find("--distributed-timeout-minutes"), std::string::npos) << message;
      EXPECT_GE(took, 0.8 * kTimeout - 0.1) << message;
      EXPECT_LE(took, kTimeout + 1.0) << message;
      if (r == 0) std::printf("[timeout] after %.2f s: %s\n", took, message.c_str());
    }
  }
  mpi_world().barrier();
  // The hung rank's communicator lost its peers: destroying it is bounded by the timeout (then aborted).
  const auto begin = std::chrono::steady_clock::now();
  w.reset();
  EXPECT_LE(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(), kTimeout + 1.0);
  mpi_world().barrier();
}

}  // namespace
}  // namespace dlm::train
