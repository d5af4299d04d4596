// The roll call over torchrun's c10d store (see roll_call.h). Keys, under the run's prefix:
//   rollcall/ping/R     a counter: each ping of rank R adds one and waits for the pong of its number
//   rollcall/pong/R/N   rank R's operation count, set by R's answering thread for ping N
#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "dlm/train/tcp_store.h"
#include "roll_call.h"

namespace dlm::train {
namespace {

constexpr auto kAnswerEvery = std::chrono::milliseconds(100);

class StoreRollCall final : public RollCall {
 public:
  StoreRollCall(const std::string& host, int port, const std::string& prefix, int rank, int size, double timeout)
      : RollCall(timeout, rank, size),
        asking_(host, port, prefix + "rollcall/", timeout, fmt::format("rank {}", rank)),
        answering_(host, port, prefix + "rollcall/", timeout, fmt::format("rank {}", rank)) {
    answerer_ = std::thread([this] { answer_until_stopped(); });
  }
  ~StoreRollCall() override {
    stop_.store(true);
    answerer_.join();
  }

 protected:
  std::map<int, long long> ping(const std::vector<int>& ranks, Clock::time_point deadline) override {
    std::map<int, std::string> waiting;  // rank -> its pong's key
    for (int r : ranks)
      if (r != world_rank()) waiting[r] = fmt::format("pong/{}/{}", r, asking_.add(fmt::format("ping/{}", r), 1));
    std::map<int, long long> answers;
    while (!waiting.empty() && Clock::now() < deadline) {
      for (auto it = waiting.begin(); it != waiting.end();) {
        if (asking_.check({it->second})) {
          const auto v = asking_.get(it->second);
          answers[it->first] = std::stoll(std::string(v.begin(), v.end()));
          it = waiting.erase(it);
        } else {
          ++it;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return answers;
  }

 private:
  // Answers every ping of this rank with its operation count; a store gone (the agent exited) ends it quietly.
  void answer_until_stopped() {
    const std::string pings = fmt::format("ping/{}", world_rank());
    std::int64_t answered = 0;
    try {
      while (!stop_.load()) {
        for (const std::int64_t asked = answering_.add(pings, 0); answered < asked;)
          answering_.set(fmt::format("pong/{}/{}", world_rank(), ++answered), std::to_string(operations_.load()));
        std::this_thread::sleep_for(kAnswerEvery);
      }
    } catch (const std::exception&) {
    }
  }

  TcpStore asking_, answering_;
  std::atomic<bool> stop_{false};
  std::thread answerer_;
};

}  // namespace

std::shared_ptr<RollCall> store_roll_call(const std::string& host, int port, const std::string& prefix, int world_rank,
                                          int world_size, double timeout_seconds) {
  return std::make_shared<StoreRollCall>(host, port, prefix, world_rank, world_size, timeout_seconds);
}

}  // namespace dlm::train
