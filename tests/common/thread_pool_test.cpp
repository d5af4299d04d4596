#include "dlm/common/thread_pool.h"

#include <atomic>
#include <numeric>
#include <stdexcept>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "sanitized.h"

#include "dlm/common/error.h"

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

// A thread that cannot be started (here: too little address space for its stack) joins
// the workers that did start and fails in one line; it used to leave the constructor stuck or terminate.
TEST(ThreadPool, ThreadThatCannotStartIsOneLineErrorNotAHang) {
  if (dlm::test::kSanitized) GTEST_SKIP() << "sanitizers need more address space than any useful RLIMIT_AS";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(20);  // a hang ends the child with SIGALRM
    const rlimit limit{rlim_t{512} << 20, rlim_t{512} << 20};
    ::setrlimit(RLIMIT_AS, &limit);
    try {
      dlm::ThreadPool pool(1000);  // 1000 stacks of 8 MiB do not fit 512 MiB
    } catch (const dlm::Error& e) {
      const std::string what = e.what();
      const bool one_line = what.find('\n') == std::string::npos;
      ::_exit(one_line && what.starts_with("cannot start thread ") && what.find(" of 1000: ") != std::string::npos ? 0 : 2);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ThreadPool, MoreThanTheMaximumIsRefused) {
  try {
    dlm::ThreadPool pool(dlm::kMaxThreads + 1);
    ADD_FAILURE() << "no error";
  } catch (const dlm::Error& e) {
    EXPECT_STREQ(e.what(), "1025 threads asked for, at most 1024");
  }
}
