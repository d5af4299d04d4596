// MPI behind the communicator seam: non-blocking operations polled against a deadline, and a roll call
// that names the lost rank when one misses it (see include/dlm/train/mpi_communicator.h).
#include "dlm/train/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "roll_call.h"

namespace dlm::train {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kDataTag = 11;

MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kUInt8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

int checked_count(std::size_t count) {
  if (count > static_cast<std::size_t>(INT_MAX)) fail(fmt::format("a single MPI transfer of {} elements is too large", count));
  return static_cast<int>(count);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<RollCall> watch, MPI_Comm comm, std::vector<int> world_ranks, std::string name)
      : watch_(std::move(watch)), comm_(comm), world_ranks_(std::move(world_ranks)), name_(std::move(name)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  const std::string& name() const override { return name_; }
  int world_rank(int rank) const override { return world_ranks_.at(static_cast<std::size_t>(rank)); }

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    const std::vector<int> ranks = split_members(color, key);
    std::vector<int> world;
    for (int r : ranks) world.push_back(world_rank(r));
    MPI_Group parent, group;
    MPI_Comm_group(comm_, &parent);
    MPI_Group_incl(parent, static_cast<int>(ranks.size()), ranks.data(), &group);
    MPI_Comm comm = MPI_COMM_NULL;
    const int rc = MPI_Comm_create_group(comm_, group, color & 0x7fff, &comm);
    MPI_Group_free(&group);
    MPI_Group_free(&parent);
    if (rc != MPI_SUCCESS) fail(fmt::format("creating the {}: {}", name, mpi_error(rc)));
    return std::make_unique<MpiCommunicator>(watch_, comm, std::move(world), std::move(name));
  }

 protected:
  void do_all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) override {
    run("all_reduce", count, type, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(count), mpi_type(type), mpi_op(op), comm_, r);
    });
  }
  void do_reduce_scatter(const void* in, void* out, std::size_t count, DataType type, ReduceOp op) override {
    run("reduce_scatter", count, type, [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in, out, checked_count(count), mpi_type(type), mpi_op(op), comm_, r);
    });
  }
  void do_all_gather(const void* in, void* out, std::size_t count, DataType type) override {
    run("all_gather", count, type, [&](MPI_Request* r) {
      return MPI_Iallgather(in, checked_count(count), mpi_type(type), out, checked_count(count), mpi_type(type), comm_, r);
    });
  }
  void do_broadcast(void* data, std::size_t count, DataType type, int root) override {
    run("broadcast", count, type, [&](MPI_Request* r) {
      return MPI_Ibcast(data, checked_count(count), mpi_type(type), root, comm_, r);
    });
  }
  void do_barrier() override {
    run("barrier", 0, DataType::kUInt8, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }
  void do_all_to_all_v(const void* in, const std::int64_t* send, void* out, const std::int64_t* recv,
                       DataType type) override {
    // MPI's counts and displacements are ints (elements): checked_count refuses what does not fit.
    const auto n = static_cast<std::size_t>(size());
    std::vector<int> send_counts(n), send_displs(n), recv_counts(n), recv_displs(n);
    std::size_t send_total = 0, recv_total = 0;
    for (std::size_t r = 0; r < n; ++r) {
      send_displs[r] = checked_count(send_total);
      recv_displs[r] = checked_count(recv_total);
      send_counts[r] = checked_count(static_cast<std::size_t>(send[r]));
      recv_counts[r] = checked_count(static_cast<std::size_t>(recv[r]));
      send_total += static_cast<std::size_t>(send[r]);
      recv_total += static_cast<std::size_t>(recv[r]);
    }
    run("all_to_all_v", std::max(send_total, recv_total), type, [&](MPI_Request* r) {
      return MPI_Ialltoallv(in, send_counts.data(), send_displs.data(), mpi_type(type), out, recv_counts.data(),
                            recv_displs.data(), mpi_type(type), comm_, r);
    });
  }
  void do_send(const void* data, std::size_t count, DataType type, int peer) override {
    run(fmt::format("send to rank {}", world_rank(peer)), count, type, [&](MPI_Request* r) {
      return MPI_Isend(data, checked_count(count), mpi_type(type), peer, checked_tag(-1), comm_, r);
    });
  }
  void do_recv(void* data, std::size_t count, DataType type, int peer) override {
    do_recv_tagged(data, count, type, peer, -1);
  }
  // Tagged transfers (pipelines) use tags above kDataTag; messages of one tag between two ranks stay in order.
  void do_send_async(const void* data, std::size_t count, DataType type, int peer, int tag) override {
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Isend(data, checked_count(count), mpi_type(type), peer, checked_tag(tag), comm_, &request);
    const std::string what = fmt::format("send to rank {}", world_rank(peer));
    if (rc != MPI_SUCCESS) fail(fmt::format("{} on the {}: {}", what, name_, mpi_error(rc)));
    pending_.push_back({request, what, count, type});
  }
  void do_recv_tagged(void* data, std::size_t count, DataType type, int peer, int tag) override {
    run(fmt::format("recv from rank {}", world_rank(peer)), count, type, [&](MPI_Request* r) {
      return MPI_Irecv(data, checked_count(count), mpi_type(type), peer, checked_tag(tag), comm_, r);
    });
  }
  void do_all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op) override {
    start_collective("all_reduce", count, type, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(count), mpi_type(type), mpi_op(op), comm_, r);
    });
  }
  void do_reduce_scatter_async(const void* in, void* out, std::size_t count, DataType type, ReduceOp op) override {
    start_collective("reduce_scatter", count, type, [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in, out, checked_count(count), mpi_type(type), mpi_op(op), comm_, r);
    });
  }
  void do_progress() override {
    for (auto& c : collectives_) {
      int done = 0;
      if (c.request != MPI_REQUEST_NULL) MPI_Test(&c.request, &done, MPI_STATUS_IGNORE);
    }
  }
  void do_wait_collectives() override { wait_all(collectives_); }
  void do_wait_sends() override { wait_all(pending_); }

 private:
  static int checked_tag(int tag) {
    if (tag < -1 || tag > 30000) fail(fmt::format("a point-to-point tag {} outside [0, 30000]", tag));
    return kDataTag + 1 + tag;  // -1 (untagged send/recv) is kDataTag itself
  }
  struct PendingSend {
    MPI_Request request;
    std::string what;
    std::size_t count;
    DataType type;
  };

  // Waits for every request started (in order), each under the timeout and roll call of run(); a request
  // a progress() test already completed is MPI_REQUEST_NULL and returns at once.
  void wait_all(std::vector<PendingSend>& started) {
    auto requests = std::move(started);
    started.clear();
    for (auto& p : requests)
      run(p.what, p.count, p.type, [&](MPI_Request* r) {
        *r = p.request;
        return MPI_SUCCESS;
      });
  }

  template <typename Start>
  void start_collective(const char* what, std::size_t count, DataType type, Start start) {
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = start(&request);
    if (rc != MPI_SUCCESS) fail(fmt::format("{} on the {}: {}", what, name_, mpi_error(rc)));
    collectives_.push_back({request, what, count, type});
  }

  template <typename Start>
  void run(const std::string& what, std::size_t count, DataType type, Start start) {
    RollCall& w = *watch_;
    const long long op = w.next_operation();
    const auto begin = Clock::now();
    const double total = w.timeout_seconds();
    const double wait_seconds = std::max(0.8 * total, total - 30.0);
    const auto describe = [&] {
      return fmt::format("{} #{} of {} bytes on the {}", what, op, count * data_type_size(type), name_);
    };
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = start(&request);
    if (rc != MPI_SUCCESS) roll_call(describe(), "failed: " + mpi_error(rc), begin);
    // MPI moves a non-blocking operation's bytes only inside MPI calls (Open MPI has no progress thread): a large
    // message without single-copy shared memory goes in fragments, a batch per call on each side. So while the
    // operation may still be moving bytes (1 ms, plus its bytes at 1 GB/s) the loop polls without sleeping, only
    // yielding the core to a thread with work; past that a peer is late (still computing) and the loop naps,
    // doubling, so that waiting ranks leave the cores to the ones still computing.
    const auto spin_until =
        begin + std::chrono::microseconds(1000 + static_cast<long long>(count * data_type_size(type) / 1000));
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      int done = 0;
      rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) roll_call(describe(), "failed: " + mpi_error(rc), begin);
      if (done) return;
      w.answer();
      if (std::chrono::duration<double>(Clock::now() - begin).count() > wait_seconds)
        roll_call(describe(), fmt::format("did not complete within {:g} min (--distributed-timeout-minutes)", total / 60), begin);
      if (Clock::now() < spin_until) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }

  // The roll call over the members (then the rest of the world): the error names the lost rank, and comes
  // within --distributed-timeout-minutes of the operation's start.
  [[noreturn]] void roll_call(const std::string& operation, const std::string& problem, Clock::time_point begin) {
    const auto deadline = begin + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(watch_->timeout_seconds()));
    throw CommunicationError(fmt::format("{} {}: {}", operation, problem, watch_->verdict(world_ranks_, deadline)));
  }

  std::shared_ptr<RollCall> watch_;
  MPI_Comm comm_;
  std::vector<int> world_ranks_;
  std::string name_;
  std::vector<PendingSend> pending_;  // send_async() requests until wait_sends()
  std::vector<PendingSend> collectives_;  // *_async() collectives until wait_collectives()
  int rank_ = 0;
};

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) fail("MPI_Init failed: " + mpi_error(rc));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiSession::~MpiSession() {
  if (finalize_) MPI_Finalize();
}

std::unique_ptr<Communicator> mpi_world_communicator(double timeout_seconds) {
  // Shared by the world and every group split from it: one operation counter per process and one roll call,
  // whose communicator is a duplicate of the world, so pings never match a data message.
  auto watch = mpi_roll_call(timeout_seconds);  // a dlm::Error unless the timeout is positive
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> world(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) world[static_cast<std::size_t>(r)] = r;
  return std::make_unique<MpiCommunicator>(std::move(watch), MPI_COMM_WORLD, std::move(world),
                                           fmt::format("world ({} ranks)", size));
}

}  // namespace dlm::train
