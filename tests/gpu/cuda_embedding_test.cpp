// The embedding backward against a double-precision host sum, with the diffusion objective's shape of
// input: one id (the mask token) at about half of all positions, so that it is cut into many segments,
// ids of exactly one segment, and ids seen once; poisoned table rows that no token names stay untouched. The
// written-row flags (the sparse embedding gradient's) name exactly the tokens' ids, and clearing them zeroes
// those rows alone.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "dlm/train/cuda_memory_plan.h"
#include "gpu_test_util.h"

namespace dlm::train::cuda {
namespace {

using gpu_test::DeviceVec;
using gpu_test::have_device;

TEST(Embedding, BackwardSumsEveryTokenOfAnIdOnce) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  const int tokens = 3000, dim = 72, vocab = 500, mask = 499;
  std::vector<int> ids(tokens);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int t = 0; t < tokens; ++t) ids[t] = u(rng) < 0.5f ? mask : static_cast<int>(rng() % 400);
  for (int t = 0; t < kEmbeddingSegment; ++t) ids[t * 7] = 450;  // exactly one full segment
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> dx(static_cast<std::size_t>(tokens) * dim), table(static_cast<std::size_t>(vocab) * dim);
  for (auto& x : dx) x = normal(rng);
  for (auto& x : table) x = normal(rng);
  std::vector<int> order;
  std::vector<EmbeddingSegment> segments;
  std::vector<EmbeddingCombine> combine;
  embedding_plan(ids.data(), tokens, order, segments, combine);
  ASSERT_LE(static_cast<std::int64_t>(segments.size()), cuda_embedding_segments(tokens));
  ASSERT_LE(static_cast<std::int64_t>(combine.size()), cuda_embedding_slots(tokens));
  ASSERT_FALSE(combine.empty());
  DeviceVec<float> ddx(dx), dtable(table), partial(static_cast<std::size_t>(cuda_embedding_slots(tokens)) * dim);
  DeviceVec<int> dorder(order);
  DeviceVec<EmbeddingSegment> dseg(segments);
  DeviceVec<EmbeddingCombine> dcomb(combine);
  DeviceVec<std::uint8_t> written(std::vector<std::uint8_t>(vocab, 0));
  embedding_backward(ddx.get(), dorder.get(), dseg.get(), static_cast<int>(segments.size()), dcomb.get(),
                     static_cast<int>(combine.size()), partial.get(), dtable.get(), written.get(), dim, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto got = dtable.download();
  // The flags name exactly the ids the tokens hold.
  std::vector<std::uint8_t> named(vocab, 0);
  for (int id : ids) named[static_cast<std::size_t>(id)] = 1;
  EXPECT_EQ(written.download(), named);
  std::vector<double> want(table.begin(), table.end());
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < dim; ++j) want[static_cast<std::size_t>(ids[t]) * dim + j] += dx[static_cast<std::size_t>(t) * dim + j];
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i])));
  EXPECT_LT(worst, 1e-5);
  // Twice on the same input: the same bits (fixed summation order).
  dtable.upload(table);
  embedding_backward(ddx.get(), dorder.get(), dseg.get(), static_cast<int>(segments.size()), dcomb.get(),
                     static_cast<int>(combine.size()), partial.get(), dtable.get(), nullptr, dim, nullptr);
  EXPECT_EQ(dtable.download(), got);
  // Clearing the written rows zeroes them and their flags and leaves every other row as it was.
  clear_written_rows(dtable.get(), written.get(), vocab, dim, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto cleared = dtable.download();
  for (int row = 0; row < vocab; ++row)
    for (int j = 0; j < dim; ++j) {
      const std::size_t i = static_cast<std::size_t>(row) * dim + j;
      ASSERT_EQ(cleared[i], named[static_cast<std::size_t>(row)] ? 0.0f : got[i]) << "row " << row;
    }
  EXPECT_EQ(written.download(), std::vector<std::uint8_t>(vocab, 0));
}

}  // namespace
}  // namespace dlm::train::cuda
