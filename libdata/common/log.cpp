#include "dlm/common/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace dlm::log {
namespace {

Level level_from_env() {
  const char* v = std::getenv("DLM_LOG_LEVEL");
  if (v == nullptr) return Level::kInfo;
  if (std::strcmp(v, "debug") == 0) return Level::kDebug;
  if (std::strcmp(v, "warning") == 0) return Level::kWarning;
  if (std::strcmp(v, "error") == 0) return Level::kError;
  return Level::kInfo;
}

std::atomic<Level> g_level{level_from_env()};
std::atomic<int> g_rank{-1};
std::mutex g_mutex;

const char* level_name(Level l) {
  switch (l) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarning: return "warning";
    case Level::kError: return "error";
  }
  return "?";
}

}  // namespace

void set_level(Level l) { g_level = l; }
Level level() { return g_level.load(std::memory_order_relaxed); }
void set_rank(int rank) { g_rank = rank; }

void write(Level l, const std::string& message) {
  auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  std::lock_guard lock(g_mutex);
  int rank = g_rank.load();
  if (rank >= 0) {
    std::fprintf(stderr, "[%s rank %d %s] %s\n", stamp, rank, level_name(l), message.c_str());
  } else {
    std::fprintf(stderr, "[%s %s] %s\n", stamp, level_name(l), message.c_str());
  }
}

}  // namespace dlm::log
