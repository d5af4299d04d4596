// NCCL behind the communicator seam: non-blocking communicators whose operations the host polls
// against the timeout, and the MPI roll call that names a lost rank (see nccl_communicator.h).
#include "dlm/train/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "dlm/train/tcp_store.h"
#include "roll_call.h"

namespace dlm::train {

using Clock = RollCall::Clock;

struct NcclCommunicator::Shared {
  std::shared_ptr<RollCall> call;  // MPI's, or the c10d store's under torchrun
  double timeout_seconds() const { return call->timeout_seconds(); }
  long long next_operation() { return call->next_operation(); }
  void answer() { call->answer(); }
  std::string verdict(const std::vector<int>& members, Clock::time_point deadline) {
    return call->verdict(members, deadline);
  }
};

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  cudaStream_t own = nullptr, stream = nullptr;
  int* scratch = nullptr;  // device ints: the barrier's operand, split's all-gather
  std::vector<int> world_ranks;
  std::string name;
  int rank = 0;
  bool aborted = false;
  // Operations enqueued by all_reduce_async and not yet waited for: the first names them in errors.
  std::string pending;
  Clock::time_point pending_since;
};

namespace {

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(fmt::format("NCCL communicator: {}: {}", what, cudaGetErrorString(e)));
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

using State = NcclCommunicator::State;
using Shared = NcclCommunicator::Shared;

// The roll call over the group's members, then the communicator is aborted (its kernels stop) and the
// operation's error thrown; the error comes within the timeout of the operation's start.
[[noreturn]] void lose(Shared& shared, State& st, const std::string& what, const std::string& problem,
                       Clock::time_point begin) {
  const auto deadline = begin + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(shared.timeout_seconds()));
  const std::string verdict = shared.verdict(st.world_ranks, deadline);
  if (st.comm) ncclCommAbort(st.comm);
  st.comm = nullptr;
  st.aborted = true;
  throw CommunicationError(fmt::format("{} {}: {}", what, problem, verdict));
}

// Polls until `comm` has no NCCL call in progress and, with `stream_too`, the stream is idle. The wait
// is 80% of the timeout (at least the timeout less 30 s); the roll call has the rest.
void settle(Shared& shared, State& st, ncclComm_t comm, const std::string& what, Clock::time_point begin,
            bool stream_too) {
  const double total = shared.timeout_seconds();
  const double wait_seconds = std::max(0.8 * total, total - 30.0);
  int polls = 0;
  auto nap = std::chrono::microseconds(10);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) state = rc;
    if (state != ncclSuccess && state != ncclInProgress)
      lose(shared, st, what, fmt::format("failed: {} ({})", ncclGetErrorString(state), ncclGetLastError(comm)), begin);
    if (state == ncclSuccess) {
      if (!stream_too) return;
      const cudaError_t q = cudaStreamQuery(st.stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) lose(shared, st, what, fmt::format("failed on the device: {}", cudaGetErrorString(q)), begin);
    }
    shared.answer();
    if (std::chrono::duration<double>(Clock::now() - begin).count() > wait_seconds)
      lose(shared, st, what, fmt::format("did not complete within {:g} min (--distributed-timeout-minutes)", total / 60),
           begin);
    // Spin briefly, then nap: the host has nothing else to do, but a microsecond-scale collective
    // should not wait a millisecond.
    if (++polls > 64) {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
  }
}

std::unique_ptr<State> make_state(ncclComm_t comm, std::vector<int> world_ranks, std::string name) {
  auto st = std::make_unique<State>();
  st->comm = comm;
  check_cuda(cudaStreamCreateWithFlags(&st->own, cudaStreamNonBlocking), "cudaStreamCreate");
  st->stream = st->own;
  const std::size_t members = world_ranks.size();
  check_cuda(cudaMalloc(&st->scratch, sizeof(int) * 3 * (members + 1)), "cudaMalloc");
  int rank = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess) fail("ncclCommUserRank failed");
  st->rank = rank;
  st->world_ranks = std::move(world_ranks);
  st->name = std::move(name);
  return st;
}

}  // namespace

NcclCommunicator::NcclCommunicator(std::shared_ptr<Shared> shared, std::unique_ptr<State> state)
    : shared_(std::move(shared)), state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() {
  State& st = *state_;
  if (st.comm) {
    // Finalize flushes what peers may still read from this rank; a peer gone for good must not keep the
    // process from exiting, so it is bounded by the timeout, then aborted.
    const auto begin = Clock::now();
    ncclResult_t state = ncclCommFinalize(st.comm);
    while (state == ncclInProgress &&
           std::chrono::duration<double>(Clock::now() - begin).count() < shared_->timeout_seconds()) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (ncclCommGetAsyncError(st.comm, &state) != ncclSuccess) break;
    }
    if (state == ncclSuccess) ncclCommDestroy(st.comm);
    else ncclCommAbort(st.comm);
  }
  if (st.scratch) cudaFree(st.scratch);
  if (st.own) cudaStreamDestroy(st.own);
}

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return static_cast<int>(state_->world_ranks.size()); }
const std::string& NcclCommunicator::name() const { return state_->name; }
int NcclCommunicator::world_rank(int rank) const { return state_->world_ranks.at(static_cast<std::size_t>(rank)); }
void* NcclCommunicator::stream() const { return state_->stream; }
void NcclCommunicator::use_stream(void* stream) { state_->stream = stream ? static_cast<cudaStream_t>(stream) : state_->own; }

namespace {

// One operation of the seam: enqueue, then poll to completion against the timeout.
template <typename Enqueue>
void run(Shared& shared, State& st, const std::string& what, std::size_t bytes, Enqueue enqueue) {
  if (st.aborted) fail(fmt::format("the {} was aborted after a failure", st.name));
  const long long op = shared.next_operation();
  const auto begin = Clock::now();
  const std::string described = fmt::format("{} #{} of {} bytes on the {}", what, op, bytes, st.name);
  const ncclResult_t rc = enqueue();
  if (rc != ncclSuccess && rc != ncclInProgress)
    lose(shared, st, described, fmt::format("failed: {} ({})", ncclGetErrorString(rc), ncclGetLastError(st.comm)), begin);
  settle(shared, st, st.comm, described, begin, true);
}

}  // namespace

void NcclCommunicator::do_all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) {
  State& st = *state_;
  run(*shared_, st, "all_reduce", count * data_type_size(type), [&] {
    return ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), st.comm, st.stream);
  });
}

void NcclCommunicator::do_reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op) {
  State& st = *state_;
  run(*shared_, st, "reduce_scatter", count * size() * data_type_size(type), [&] {
    return ncclReduceScatter(in, out, count, nccl_type(type), nccl_op(op), st.comm, st.stream);
  });
}

void NcclCommunicator::do_all_gather(const void* in, void* out, std::size_t count, DataType type) {
  State& st = *state_;
  run(*shared_, st, "all_gather", count * data_type_size(type), [&] {
    return ncclAllGather(in, out, count, nccl_type(type), st.comm, st.stream);
  });
}

void NcclCommunicator::do_broadcast(void* data, std::size_t count, DataType type, int root) {
  State& st = *state_;
  run(*shared_, st, "broadcast", count * data_type_size(type), [&] {
    return ncclBroadcast(data, data, count, nccl_type(type), root, st.comm, st.stream);
  });
}

void NcclCommunicator::do_barrier() {
  State& st = *state_;
  run(*shared_, st, "barrier", 0, [&] { return ncclAllReduce(st.scratch, st.scratch, 1, ncclInt32, ncclSum, st.comm, st.stream); });
}

void NcclCommunicator::do_all_to_all_v(const void* in, const std::int64_t* send, void* out, const std::int64_t* recv,
                                       DataType type) {
  State& st = *state_;
  const std::size_t element = data_type_size(type), n = static_cast<std::size_t>(size());
  std::size_t bytes = 0;
  for (std::size_t r = 0; r < n; ++r) bytes += static_cast<std::size_t>(send[r]) * element;
  run(*shared_, st, "all_to_all_v", bytes, [&] {
    ncclResult_t rc = ncclGroupStart();
    std::size_t send_at = 0, recv_at = 0;
    for (std::size_t r = 0; r < n && rc == ncclSuccess; ++r) {
      const auto peer = static_cast<int>(r);
      if (send[r] > 0)
        rc = ncclSend(static_cast<const std::uint8_t*>(in) + send_at * element, static_cast<std::size_t>(send[r]),
                      nccl_type(type), peer, st.comm, st.stream);
      if (rc == ncclSuccess && recv[r] > 0)
        rc = ncclRecv(static_cast<std::uint8_t*>(out) + recv_at * element, static_cast<std::size_t>(recv[r]),
                      nccl_type(type), peer, st.comm, st.stream);
      send_at += static_cast<std::size_t>(send[r]);
      recv_at += static_cast<std::size_t>(recv[r]);
    }
    const ncclResult_t end = ncclGroupEnd();
    return rc != ncclSuccess ? rc : end;
  });
}

void NcclCommunicator::do_send(const void* data, std::size_t count, DataType type, int peer) {
  State& st = *state_;
  run(*shared_, st, fmt::format("send to rank {}", world_rank(peer)), count * data_type_size(type), [&] {
    return ncclSend(data, count, nccl_type(type), peer, st.comm, st.stream);
  });
}

void NcclCommunicator::do_recv(void* data, std::size_t count, DataType type, int peer) {
  State& st = *state_;
  run(*shared_, st, fmt::format("recv from rank {}", world_rank(peer)), count * data_type_size(type), [&] {
    return ncclRecv(data, count, nccl_type(type), peer, st.comm, st.stream);
  });
}

void NcclCommunicator::enqueue_all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, void* after) {
  State& st = *state_;
  if (st.aborted) fail(fmt::format("the {} was aborted after a failure", st.name));
  if (after) check_cuda(cudaStreamWaitEvent(st.stream, static_cast<cudaEvent_t>(after), 0), "cudaStreamWaitEvent");
  enqueued("all_reduce", count * data_type_size(type), [&] {
    return static_cast<int>(ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), st.comm, st.stream));
  });
}

void NcclCommunicator::enqueue(const std::string& what, std::size_t bytes, void* stream,
                               const std::function<int(void*, void*)>& call) {
  State& st = *state_;
  if (st.aborted) fail(fmt::format("the {} was aborted after a failure", st.name));
  use_stream(stream);
  enqueued(what, bytes, [&] { return call(st.comm, st.stream); });
}

// Posts an operation without waiting for it on the device; the first one not yet waited for names the
// batch in a timeout's message.
void NcclCommunicator::enqueued(const std::string& what, std::size_t bytes, const std::function<int()>& post) {
  State& st = *state_;
  const long long op_index = shared_->next_operation();
  const auto begin = Clock::now();
  const std::string described = fmt::format("{} #{} of {} bytes on the {}", what, op_index, bytes, st.name);
  const auto rc = static_cast<ncclResult_t>(post());
  if (rc != ncclSuccess && rc != ncclInProgress)
    lose(*shared_, st, described, fmt::format("failed: {} ({})", ncclGetErrorString(rc), ncclGetLastError(st.comm)), begin);
  settle(*shared_, st, st.comm, described, begin, false);  // the host-side enqueue only
  if (st.pending.empty()) st.pending = described, st.pending_since = begin;
}

void NcclCommunicator::wait() {
  State& st = *state_;
  if (st.aborted) fail(fmt::format("the {} was aborted after a failure", st.name));
  if (st.pending.empty()) {
    run(*shared_, st, "wait", 0, [] { return ncclSuccess; });
    return;
  }
  settle(*shared_, st, st.comm, st.pending, st.pending_since, true);
  st.pending.clear();
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, std::string name) {
  State& st = *state_;
  // Members and their order from an all-gather of (color, key, world rank) over this group.
  const int n = size();
  const std::int32_t mine[3] = {color, key, world_rank(rank())};
  check_cuda(cudaMemcpyAsync(st.scratch, mine, sizeof mine, cudaMemcpyHostToDevice, st.stream), "copy");
  all_gather<std::int32_t>(std::span<const std::int32_t>(st.scratch, 3), std::span<std::int32_t>(st.scratch + 3, 3 * n));
  std::vector<std::int32_t> all(static_cast<std::size_t>(3 * n));
  // The stream is idle (all_gather returned), so this copy cannot wait on a peer.
  check_cuda(cudaMemcpy(all.data(), st.scratch + 3, all.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost), "copy");
  std::vector<std::pair<int, int>> members;  // (key, world rank)
  for (int r = 0; r < n; ++r)
    if (all[static_cast<std::size_t>(3 * r)] == color)
      members.emplace_back(all[static_cast<std::size_t>(3 * r + 1)], all[static_cast<std::size_t>(3 * r + 2)]);
  std::sort(members.begin(), members.end());
  std::vector<int> world;
  for (const auto& m : members) world.push_back(m.second);

  const long long op = shared_->next_operation();
  const auto begin = Clock::now();
  const std::string described = fmt::format("split #{} of the {} into the {}", op, st.name, name);
  ncclConfig_t config = nonblocking_config();
  ncclComm_t child = nullptr;
  const ncclResult_t rc = ncclCommSplit(st.comm, color, key, &child, &config);
  if (rc != ncclSuccess && rc != ncclInProgress)
    lose(*shared_, st, described, fmt::format("failed: {} ({})", ncclGetErrorString(rc), ncclGetLastError(st.comm)), begin);
  settle(*shared_, st, st.comm, described, begin, false);
  if (!child) fail(fmt::format("{}: NCCL returned no communicator", described));
  State probe;  // the child's members, for a roll call while it initializes
  probe.comm = child;
  probe.world_ranks = world;
  probe.stream = st.stream;
  try {
    settle(*shared_, probe, child, described, begin, false);
  } catch (...) {
    st.aborted = true;  // the parent shares the failed split's peers
    throw;
  }
  return std::make_unique<NcclCommunicator>(shared_, make_state(child, std::move(world), std::move(name)));
}

std::unique_ptr<NcclCommunicator> nccl_world_communicator(Communicator& mpi_world, int device, double timeout_seconds,
                                                         const std::shared_ptr<TcpStore>& store) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;  // no driver: no GPU
  if (device < 0 || device >= devices)
    fail(fmt::format("rank {}: local rank {} has no GPU ({} on this node): start at most one rank per GPU",
                     mpi_world.rank(), device, devices));
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  auto shared = std::make_shared<Shared>();
  ncclUniqueId id{};
  if (mpi_world.rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess) fail("ncclGetUniqueId failed");
  auto* id_bytes = reinterpret_cast<std::uint8_t*>(&id);
  if (store) {
    // torchrun: rank 0 publishes the id in the c10d store, the others wait for it there.
    // Worlds are made in the same order on every rank: their count keeps each world's keys apart.
    static int worlds = 0;
    const std::string keys = fmt::format("nccl/world{}/", worlds++);
    shared->call = store_roll_call(store->host(), store->port(), store->prefix() + keys, mpi_world.rank(),
                                   mpi_world.size(), timeout_seconds);
    if (mpi_world.rank() == 0) {
      store->set(keys + "unique_id", std::span<const std::uint8_t>(id_bytes, sizeof id));
    } else {
      const auto got = store->get(keys + "unique_id");
      if (got.size() != sizeof id) fail(fmt::format("the NCCL unique id in the c10d store has {} bytes, not {}", got.size(), sizeof id));
      std::copy(got.begin(), got.end(), id_bytes);
    }
  } else {
    shared->call = mpi_roll_call(timeout_seconds);
    mpi_world.broadcast(std::span<std::uint8_t>(id_bytes, sizeof id), 0);
  }
  const int n = mpi_world.size();
  std::vector<int> world(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) world[static_cast<std::size_t>(r)] = mpi_world.world_rank(r);
  const long long op = shared->next_operation();
  const auto begin = Clock::now();
  const std::string described = fmt::format("ncclCommInitRank #{} of the NCCL world ({} ranks)", op, n);
  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, n, id, mpi_world.rank(), &config);
  State probe;
  probe.comm = comm;
  probe.world_ranks = world;
  if (rc != ncclSuccess && rc != ncclInProgress)
    lose(*shared, probe, described, fmt::format("failed: {} ({})", ncclGetErrorString(rc), ncclGetLastError(comm)), begin);
  settle(*shared, probe, comm, described, begin, false);
  return std::make_unique<NcclCommunicator>(
      shared, make_state(comm, std::move(world), fmt::format("NCCL world ({} ranks)", n)));
}

}  // namespace dlm::train
