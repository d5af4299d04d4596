// Progress: reports a long job's advance on stderr.
//
// On a terminal: one line redrawn in place with a bar (when the total is known), rate and ETA.
// Otherwise: a plain line every `interval` seconds, fit for logs.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace dlm {

class Progress {
 public:
  // `unit` names what is counted ("MB", "docs"); total 0 means unknown.
  Progress(std::string label, std::string unit, double total = 0, double interval_seconds = 1.0,
           std::FILE* out = stderr);
  // Records `done` units so far (absolute); prints when the interval has passed.
  void update(double done, const std::string& extra = {});
  // Prints the final line.
  void finish(const std::string& extra = {});
  bool interactive() const noexcept { return interactive_; }

 private:
  void print(double done, const std::string& extra, bool final);
  std::string label_, unit_;
  double total_, interval_;
  std::FILE* out_;
  bool interactive_;
  std::chrono::steady_clock::time_point start_, last_;
  std::mutex mutex_;
};

// "1.5 GB", "320 MB": a byte count for people.
std::string human_bytes(double bytes);
// "1h02m", "3m05s", "12s".
std::string human_duration(double seconds);

}  // namespace dlm
