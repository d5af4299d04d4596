// Logging to stderr with a level, a timestamp and the rank when running under MPI.
#pragma once

#include <string>

#include <fmt/format.h>

namespace dlm::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below the level are dropped; the default is kInfo, or DLM_LOG_LEVEL=debug|info|warning|error.
void set_level(Level level);
Level level();
// Prefix every line with "[rank N]" (set by the parallel runtime).
void set_rank(int rank);
void write(Level level, const std::string& message);

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kDebug) write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kInfo) write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warning(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kWarning) write(Level::kWarning, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dlm::log
