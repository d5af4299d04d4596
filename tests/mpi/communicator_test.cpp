// The MPI communicator on 4 ranks: each collective's result, point-to-point, and the process groups
// of every layout of 4 ranks split from the world (their members are Megatron's).
#include <numeric>

#include "dlm/train/parallel.h"
#include "mpi_test_main.h"

namespace dlm::test {
namespace {

using train::ReduceOp;

TEST(MpiCommunicator, Collectives) {
  auto& w = mpi_world();
  const int r = w.rank(), n = w.size();
  std::vector<double> x = {1.0 * r, 2.0};
  w.all_reduce<double>(x);
  EXPECT_EQ(x, (std::vector<double>{n * (n - 1) / 2.0, 2.0 * n}));
  std::int64_t m = r * 10;
  w.all_reduce(std::span<std::int64_t>(&m, 1), ReduceOp::kMax);
  EXPECT_EQ(m, (n - 1) * 10);

  // reduce_scatter: rank r contributes r + i at element i; block k holds sum_r (r + i).
  std::vector<float> in(static_cast<std::size_t>(2 * n)), out(2);
  std::iota(in.begin(), in.end(), static_cast<float>(r));
  w.reduce_scatter<float>(in, out);
  const float ranks = n * (n - 1) / 2.0f;
  EXPECT_EQ(out, (std::vector<float>{ranks + n * (2.0f * r), ranks + n * (2.0f * r + 1)}));

  std::vector<std::int32_t> mine = {r, -r}, all(static_cast<std::size_t>(2 * n));
  w.all_gather<std::int32_t>(mine, all);
  for (int k = 0; k < n; ++k) EXPECT_EQ(all[static_cast<std::size_t>(2 * k)], k);

  std::uint8_t b = r == 2 ? 42 : 0;
  w.broadcast(std::span<std::uint8_t>(&b, 1), 2);
  EXPECT_EQ(b, 42);
  w.barrier();
}

TEST(MpiCommunicator, SendRecvAlongARing) {
  auto& w = mpi_world();
  const int r = w.rank(), n = w.size();
  std::vector<float> token = {static_cast<float>(r)}, got(1);
  // Even ranks send first, odd ones receive first: no rank waits on a send that nobody receives.
  if (r % 2 == 0) {
    w.send<float>(token, (r + 1) % n);
    w.recv<float>(got, (r + n - 1) % n);
  } else {
    w.recv<float>(got, (r + n - 1) % n);
    w.send<float>(token, (r + 1) % n);
  }
  EXPECT_EQ(got[0], static_cast<float>((r + n - 1) % n));
}

TEST(MpiCommunicator, ProcessGroupsOfEveryLayoutAreMegatrons) {
  auto& w = mpi_world();
  for (const auto& [tp, pp] : {std::pair{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}}) {
    const auto config = train::derive_parallel_config(w.size(), tp, pp);
    auto groups = train::make_process_groups(w, config);
    const auto check = [&](train::Communicator& g, const std::vector<int>& want) {
      ASSERT_EQ(g.size(), static_cast<int>(want.size())) << g.name();
      for (int k = 0; k < g.size(); ++k) EXPECT_EQ(g.world_rank(k), want[static_cast<std::size_t>(k)]) << g.name();
      EXPECT_EQ(g.world_rank(g.rank()), w.rank()) << g.name();
      // A collective on the group sums exactly its members' world ranks.
      std::int64_t sum = w.rank();
      g.all_reduce(std::span<std::int64_t>(&sum, 1));
      EXPECT_EQ(sum, std::accumulate(want.begin(), want.end(), std::int64_t{0})) << g.name();
    };
    check(*groups.tensor, train::tensor_parallel_ranks(config, w.rank()));
    check(*groups.data, train::data_parallel_ranks(config, w.rank()));
    check(*groups.pipeline, train::pipeline_parallel_ranks(config, w.rank()));
  }
}

}  // namespace
}  // namespace dlm::test
