#include "dlm/common/progress.h"

#include <unistd.h>

#include <cmath>

#include <fmt/format.h>

namespace dlm {

Progress::Progress(std::string label, std::string unit, double total, double interval_seconds, std::FILE* out)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      interval_(interval_seconds),
      out_(out),
      interactive_(::isatty(::fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

void Progress::update(double done, const std::string& extra) {
  std::lock_guard lock(mutex_);
  auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_).count() < interval_) return;
  last_ = now;
  print(done, extra, false);
}

void Progress::finish(const std::string& extra) {
  std::lock_guard lock(mutex_);
  print(total_, extra, true);
}

void Progress::print(double done, const std::string& extra, bool final) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = elapsed > 0 ? done / elapsed : 0;
  std::string line = fmt::format("{}: {:.1f} {} ({:.1f} {}/s)", label_, done, unit_, rate, unit_);
  if (total_ > 0 && !final) {
    double fraction = std::min(1.0, done / total_);
    if (interactive_) {
      int filled = static_cast<int>(std::lround(fraction * 30));
      line = fmt::format("{} [{}{}] {:5.1f}%", label_, std::string(filled, '#'), std::string(30 - filled, '.'),
                         fraction * 100) +
             fmt::format(" {:.1f}/{:.1f} {} {:.1f} {}/s", done, total_, unit_, rate, unit_);
    } else {
      line += fmt::format(" {:.1f}%", fraction * 100);
    }
    if (rate > 0) line += " ETA " + human_duration((total_ - done) / rate);
  }
  if (final) line += " in " + human_duration(elapsed);
  if (!extra.empty()) line += " " + extra;
  if (interactive_) {
    fmt::print(out_, "\r\033[K{}{}", line, final ? "\n" : "");
  } else {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

std::string human_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace dlm
