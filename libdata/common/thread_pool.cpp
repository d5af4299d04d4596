#include "dlm/common/thread_pool.h"

#include <algorithm>
#include <string>
#include <system_error>

#include "dlm/common/error.h"

namespace dlm {

void start_threads(std::vector<std::thread>& threads, std::size_t count, const std::function<std::thread(std::size_t)>& make,
                   const std::function<void()>& stop) {
  const std::size_t before = threads.size();
  try {
    threads.reserve(before + count);
    for (std::size_t i = 0; i < count; ++i) threads.push_back(make(i));
  } catch (const std::system_error& e) {
    const std::size_t started = threads.size() - before;
    stop();
    for (auto& t : threads) if (t.joinable()) t.join();
    threads.clear();
    fail("cannot start thread " + std::to_string(started + 1) + " of " + std::to_string(count) + ": " +
         e.code().message() + " (ask for fewer threads, or raise the process or memory limit)");
  }
}

ThreadPool::ThreadPool(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  if (threads > kMaxThreads)
    fail(std::to_string(threads) + " threads asked for, at most " + std::to_string(kMaxThreads));
  start_threads(workers_, threads, [this](std::size_t) { return std::thread([this] { run_worker(); }); },
                [this] { stop(); });
}

ThreadPool::~ThreadPool() {
  stop();
  for (auto& t : workers_) t.join();
}

void ThreadPool::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
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
