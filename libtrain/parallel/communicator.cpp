// The seam's shared pieces and the group of one.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "dlm/train/communicator.h"

namespace dlm::train {

std::size_t data_type_size(DataType type) {
  switch (type) {
    case DataType::kFloat32: case DataType::kInt32: return 4;
    case DataType::kFloat64: case DataType::kInt64: return 8;
    case DataType::kUInt8: return 1;
  }
  return 0;
}

void Communicator::check_blocks(std::size_t whole, std::size_t block, const char* what) const {
  if (whole != block * static_cast<std::size_t>(size()))
    fail(fmt::format("{} on the {}: {} elements are not {} blocks of {}", what, name(), whole, size(), block));
}

void Communicator::check_all_to_all(std::size_t input, std::span<const std::int64_t> send_counts, std::size_t output,
                                    std::span<const std::int64_t> recv_counts) const {
  const auto total = [&](std::span<const std::int64_t> counts, const char* which) {
    if (counts.size() != static_cast<std::size_t>(size()))
      fail(fmt::format("all_to_all_v on the {}: {} {} counts for {} members", name(), counts.size(), which, size()));
    std::int64_t sum = 0;
    for (std::int64_t c : counts) {
      if (c < 0) fail(fmt::format("all_to_all_v on the {}: a negative {} count {}", name(), which, c));
      sum += c;
    }
    return static_cast<std::size_t>(sum);
  };
  if (total(send_counts, "send") != input || total(recv_counts, "receive") != output)
    fail(fmt::format("all_to_all_v on the {}: {} input and {} output elements for counts summing to {} and {}", name(),
                     input, output, total(send_counts, "send"), total(recv_counts, "receive")));
}

std::vector<int> Communicator::split_members(int color, int key) {
  const std::vector<std::int32_t> mine = {color, key, rank()};
  std::vector<std::int32_t> all(mine.size() * static_cast<std::size_t>(size()));
  all_gather<std::int32_t>(mine, all);
  std::vector<std::pair<int, int>> members;  // (key, group rank)
  for (int r = 0; r < size(); ++r)
    if (all[static_cast<std::size_t>(3 * r)] == color) members.emplace_back(all[static_cast<std::size_t>(3 * r + 1)], r);
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (const auto& m : members) ranks.push_back(m.second);
  return ranks;
}

namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  int world_rank(int) const override { return 0; }
  std::unique_ptr<Communicator> split(int, int, std::string) override {
    return std::make_unique<SingleProcessCommunicator>();
  }

 protected:
  void do_all_reduce(void*, std::size_t, DataType, ReduceOp) override {}
  void do_reduce_scatter(const void* in, void* out, std::size_t n, DataType t, ReduceOp) override {
    if (in != out) std::memmove(out, in, n * data_type_size(t));
  }
  void do_all_gather(const void* in, void* out, std::size_t n, DataType t) override {
    if (in != out) std::memmove(out, in, n * data_type_size(t));
  }
  void do_broadcast(void*, std::size_t, DataType, int) override {}
  void do_barrier() override {}
  void do_all_to_all_v(const void* in, const std::int64_t* send, void* out, const std::int64_t*, DataType t) override {
    if (in != out) std::memmove(out, in, static_cast<std::size_t>(send[0]) * data_type_size(t));
  }
  void do_send(const void*, std::size_t, DataType, int) override { fail("send: a group of one has no peer"); }
  void do_recv(void*, std::size_t, DataType, int) override { fail("recv: a group of one has no peer"); }

 private:
  std::string name_ = "single-process group";
};

}  // namespace

std::unique_ptr<Communicator> make_single_process_communicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

}  // namespace dlm::train
