// The communicator seam of parallel training: the collectives and point-to-point transfers the trainer
// needs, over one group of ranks. The MPI implementation (mpi_communicator.h) runs every layout on CPUs;
// an NCCL implementation for the CUDA backend goes behind the same interface. Nothing above this header
// names MPI or NCCL.
//
// Every member of a group calls the same collectives in the same order. Counts are elements. A
// collective that does not complete within the group's timeout (--distributed-timeout-minutes) throws
// CommunicationError naming the rank that was lost; it never hangs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dlm/common/error.h"

namespace dlm::train {

enum class DataType { kFloat32, kFloat64, kInt32, kInt64, kUInt8 };
enum class ReduceOp { kSum, kMax, kMin };
std::size_t data_type_size(DataType type);

template <typename T>
constexpr DataType data_type_of() {
  if constexpr (std::is_same_v<T, float>) return DataType::kFloat32;
  else if constexpr (std::is_same_v<T, double>) return DataType::kFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DataType::kInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DataType::kInt64;
  else {
    static_assert(std::is_same_v<T, std::uint8_t>, "no DataType for this element type");
    return DataType::kUInt8;
  }
}

// A rank died or hung (or the transport failed): the message names the group, the operation and the
// lost rank(s). The process cannot leave MPI cleanly after this; dlm-train exits 1 without finalizing.
class CommunicationError : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "data-parallel group (world ranks 0,1,2,3)": used in error messages.
  virtual const std::string& name() const = 0;
  // The world rank of group member `rank` (error messages name world ranks).
  virtual int world_rank(int rank) const = 0;

  // In place: every member ends with the element-wise reduction.
  template <typename T>
  void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::kSum) {
    do_all_reduce(data.data(), data.size(), data_type_of<std::remove_const_t<T>>(), op);
  }
  // input: size() blocks of output.size() elements; member r gets block r of the reduction.
  template <typename T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum) {
    check_blocks(input.size(), output.size(), "reduce_scatter");
    do_reduce_scatter(input.data(), output.data(), output.size(), data_type_of<T>(), op);
  }
  // output: size() blocks of input.size() elements, member r's input at block r.
  template <typename T>
  void all_gather(std::span<const T> input, std::span<T> output) {
    check_blocks(output.size(), input.size(), "all_gather");
    do_all_gather(input.data(), output.data(), input.size(), data_type_of<T>());
  }
  template <typename T>
  void broadcast(std::span<T> data, int root) {
    do_broadcast(data.data(), data.size(), data_type_of<T>(), root);
  }
  void barrier() { do_barrier(); }
  // Member r's block `send_counts[r]` of `input` (blocks consecutive, in member order) goes to member r; block r of
  // `output` (`recv_counts[r]` elements) comes from member r. recv_counts[r] here must be send_counts[me] on r
  // (exchange the counts first with the equal-block form below). MPI_Alltoallv; MoE's token dispatch and combine.
  template <typename T>
  void all_to_all_v(std::span<const T> input, std::span<const std::int64_t> send_counts, std::span<T> output,
                    std::span<const std::int64_t> recv_counts) {
    check_all_to_all(input.size(), send_counts, output.size(), recv_counts);
    do_all_to_all_v(input.data(), send_counts.data(), output.data(), recv_counts.data(), data_type_of<T>());
  }
  // Equal blocks: input and output are size() blocks of input.size() / size() elements.
  template <typename T>
  void all_to_all(std::span<const T> input, std::span<T> output) {
    const std::vector<std::int64_t> counts(static_cast<std::size_t>(size()),
                                           static_cast<std::int64_t>(input.size()) / std::max(size(), 1));
    all_to_all_v(input, std::span<const std::int64_t>(counts), output, std::span<const std::int64_t>(counts));
  }
  // Point-to-point (pipeline stages): blocks until the transfer completes or the timeout.
  template <typename T>
  void send(std::span<const T> data, int peer) {
    do_send(data.data(), data.size(), data_type_of<T>(), peer);
  }
  template <typename T>
  void recv(std::span<T> data, int peer) {
    do_recv(data.data(), data.size(), data_type_of<T>(), peer);
  }
  // Pipelines: a send that returns at once (the data must stay untouched until wait_sends()), and a
  // receive that matches only sends of the same tag (0 .. 30000). Messages of one tag between two ranks
  // arrive in the order they were sent. Every send_async must be waited for.
  template <typename T>
  void send_async(std::span<const T> data, int peer, int tag) {
    do_send_async(data.data(), data.size(), data_type_of<T>(), peer, tag);
  }
  template <typename T>
  void recv(std::span<T> data, int peer, int tag) {
    do_recv_tagged(data.data(), data.size(), data_type_of<T>(), peer, tag);
  }
  void wait_sends() { do_wait_sends(); }
  // Overlap (--overlap-grad-reduce): collectives that start now and complete in wait_collectives(); the
  // buffers must stay untouched until then. Every member starts them in the same order. progress() lets
  // a transport without a progress thread move them on while the caller computes.
  template <typename T>
  void all_reduce_async(std::span<T> data, ReduceOp op = ReduceOp::kSum) {
    do_all_reduce_async(data.data(), data.size(), data_type_of<std::remove_const_t<T>>(), op);
  }
  template <typename T>
  void reduce_scatter_async(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum) {
    check_blocks(input.size(), output.size(), "reduce_scatter");
    do_reduce_scatter_async(input.data(), output.data(), output.size(), data_type_of<T>(), op);
  }
  void progress() { do_progress(); }
  void wait_collectives() { do_wait_collectives(); }
  // The members with the same color form a new group, ordered by key (MPI_Comm_split, ncclCommSplit).
  // Collective over this group.
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;

 protected:
  // For split(): the group ranks of this group's members that pass `color`, ordered by their keys (ties by
  // group rank), from an all-gather over this group (so a rank lost during start-up is named like one lost later).
  std::vector<int> split_members(int color, int key);
  virtual void do_all_reduce(void* data, std::size_t count, DataType type, ReduceOp op) = 0;
  virtual void do_reduce_scatter(const void* input, void* output, std::size_t count, DataType type, ReduceOp op) = 0;
  virtual void do_all_gather(const void* input, void* output, std::size_t count, DataType type) = 0;
  virtual void do_broadcast(void* data, std::size_t count, DataType type, int root) = 0;
  virtual void do_barrier() = 0;
  // Counts are size() entries each; the blocks sit end to end in input and output.
  virtual void do_all_to_all_v(const void* input, const std::int64_t* send_counts, void* output,
                               const std::int64_t* recv_counts, DataType type) = 0;
  virtual void do_send(const void* data, std::size_t count, DataType type, int peer) = 0;
  virtual void do_recv(void* data, std::size_t count, DataType type, int peer) = 0;
  // Defaults for transports without tags or asynchronous sends (they must then keep the order of
  // transfers between two ranks the same on both sides): a blocking send, an untagged receive.
  virtual void do_send_async(const void* data, std::size_t count, DataType type, int peer, int /*tag*/) {
    do_send(data, count, type, peer);
  }
  virtual void do_recv_tagged(void* data, std::size_t count, DataType type, int peer, int /*tag*/) {
    do_recv(data, count, type, peer);
  }
  virtual void do_wait_sends() {}
  // Defaults for transports that complete collectives in order on their own (NCCL's stream): run them now.
  virtual void do_all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op) {
    do_all_reduce(data, count, type, op);
  }
  virtual void do_reduce_scatter_async(const void* input, void* output, std::size_t count, DataType type, ReduceOp op) {
    do_reduce_scatter(input, output, count, type, op);
  }
  virtual void do_progress() {}
  virtual void do_wait_collectives() {}

 private:
  void check_blocks(std::size_t whole, std::size_t block, const char* what) const;
  void check_all_to_all(std::size_t input, std::span<const std::int64_t> send_counts, std::size_t output,
                        std::span<const std::int64_t> recv_counts) const;
};

// A group of one: every collective is a copy (single-process runs, and tests of the seam).
std::unique_ptr<Communicator> make_single_process_communicator();

}  // namespace dlm::train
