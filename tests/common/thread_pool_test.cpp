#include "dlm/common/thread_pool.h"

#include <atomic>
#include <numeric>
#include <stdexcept>

#include <gtest/gtest.h>

TEST(ThreadPool, SubmitReturnsResults) {
  dlm::ThreadPool pool(3);
  std::vector<std::future<int>> results;
  for (int i = 0; i < 100; ++i) results.push_back(pool.submit([i] { return i * i; }));
  long sum = 0;
  for (auto& r : results) sum += r.get();
  EXPECT_EQ(sum, 328350);
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  dlm::ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1001);
  pool.parallel_for(hits.size(), [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, ParallelForRethrows) {
  dlm::ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(10, [](std::size_t b, std::size_t) {
    if (b == 0) throw std::runtime_error("boom");
  }), std::runtime_error);
}

TEST(ThreadPool, DestructorDrainsQueue) {
  std::atomic<int> done{0};
  {
    dlm::ThreadPool pool(2);
    for (int i = 0; i < 50; ++i) pool.submit([&] { done++; });
  }
  EXPECT_EQ(done.load(), 50);
}
