// ThreadPool: a fixed set of worker threads running submitted tasks in FIFO order.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace dlm {

// The most threads a pool (or dlm-preprocess's --workers) may ask for: more is a usage error, not a
// process limit found one std::thread at a time.
inline constexpr std::size_t kMaxThreads = 1024;

// Starts `count` threads running make(i) into `threads`. If one cannot be started (a process or memory
// limit), `stop` is called, every thread started is joined, and a one-line dlm::Error says how many
// started and why.
void start_threads(std::vector<std::thread>& threads, std::size_t count, const std::function<std::thread(std::size_t)>& make,
                   const std::function<void()>& stop);

class ThreadPool {
 public:
  // threads == 0 means std::thread::hardware_concurrency(); more than kMaxThreads throws dlm::Error, as
  // does a thread that cannot be started (after joining those that did).
  explicit ThreadPool(std::size_t threads = 0);
  ~ThreadPool();  // finishes queued tasks, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t size() const noexcept { return workers_.size(); }

  // Runs f() on a worker; the future carries its result or exception.
  template <typename F>
  auto submit(F&& f) -> std::future<std::invoke_result_t<F>> {
    using R = std::invoke_result_t<F>;
    auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
    std::future<R> result = task->get_future();
    enqueue([task] { (*task)(); });
    return result;
  }

  // Calls body(begin, end) over [0, n) cut into about size() contiguous chunks, and waits.
  // The first exception thrown by a chunk is rethrown here.
  void parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& body);

 private:
  void enqueue(std::function<void()> job);
  void run_worker();
  void stop();

  std::vector<std::thread> workers_;
  std::deque<std::function<void()>> jobs_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
};

}  // namespace dlm
