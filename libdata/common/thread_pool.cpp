#include "dlm/common/thread_pool.h"

#include <algorithm>

namespace dlm {

ThreadPool::ThreadPool(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { run_worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::enqueue(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
}

void ThreadPool::run_worker() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping and drained
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void ThreadPool::parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& body) {
  if (n == 0) return;
  std::size_t chunks = std::min(n, size());
  std::vector<std::future<void>> done;
  done.reserve(chunks);
  for (std::size_t c = 0; c < chunks; ++c) {
    std::size_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    done.push_back(submit([&body, begin, end] { body(begin, end); }));
  }
  // Wait for every chunk before rethrowing, so no task outlives `body`.
  for (auto& f : done) f.wait();
  for (auto& f : done) f.get();
}

}  // namespace dlm
