// Megatron's progress.txt (include/dlm/train/progress_log.h).
#include "dlm/train/progress_log.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/megatron_log.h"

namespace dlm::train {
namespace {

// Megatron's progress lines carry local time to the second.
std::string local_seconds(std::chrono::system_clock::time_point t) { return megatron_timestamp(t).substr(0, 19); }

std::chrono::system_clock::time_point parse_local_seconds(const std::string& text) {
  std::tm local{};
  local.tm_isdst = -1;
  if (!strptime(text.c_str(), "%Y-%m-%d %H:%M:%S", &local)) return {};
  return std::chrono::system_clock::from_time_t(std::mktime(&local));
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (std::size_t tab; (tab = line.find('\t', at)) != std::string::npos; at = tab + 1) out.push_back(line.substr(at, tab - at));
  out.push_back(line.substr(at));
  return out;
}

// The value after ": " of a field ("# GPUs: 8" -> "8").
std::string field(const std::string& f) {
  const auto at = f.find(": ");
  return at == std::string::npos ? "" : f.substr(at + 2);
}

struct CumulativeStart {
  std::chrono::system_clock::time_point time;
  double flops = 0;
  bool found = false;
};

// get_start_time_from_progress_log: the first "Starting job" of the last run of lines with this world size, and the
// FLOPs of the last checkpoint saved before it.
CumulativeStart cumulative_start(const std::string& path, int world_size) {
  CumulativeStart start;
  std::ifstream in(path);
  double latest_flops = 0;
  for (std::string line; std::getline(in, line);) {
    const auto t = split_tabs(line);
    if (t.size() < 4) continue;
    if (t[3] == "Saved checkpoint" && t.size() > 7) latest_flops = std::strtod(field(t[7]).c_str(), nullptr);
    if (std::strtol(field(t[2]).c_str(), nullptr, 10) != world_size) {
      start = {};
      continue;
    }
    if (t[3] == "Starting job" && !start.found) start = {parse_local_seconds(t[0]), latest_flops, true};
  }
  return start;
}

}  // namespace

ProgressLog::ProgressLog(std::string dir, std::string job_id, int world_size, double flops_at_start)
    : path_((std::filesystem::path(dir) / "progress.txt").string()), job_id_(std::move(job_id)),
      world_size_(world_size), flops_at_start_(flops_at_start), started_(std::chrono::system_clock::now()) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail_at(dir, fmt::format("--log-progress: cannot create the folder: {}", ec.message()));
  append("Starting job");
}

void ProgressLog::saved_checkpoint(std::int64_t iteration, double flops_so_far, double tokens) {
  const auto now = std::chrono::system_clock::now();
  // A save within the clock's resolution of the start would divide by zero: at least a millisecond.
  const double job_seconds = std::max(1e-3, std::chrono::duration<double>(now - started_).count());
  const double job = (flops_so_far - flops_at_start_) / (job_seconds * 1e12 * world_size_);
  const CumulativeStart start = cumulative_start(path_, world_size_);
  const double since = std::max(1e-3, std::chrono::duration<double>(now - (start.found ? start.time : started_)).count());
  const double cumulative = (flops_so_far - (start.found ? start.flops : flops_at_start_)) / (since * 1e12 * world_size_);
  append(fmt::format("Saved checkpoint\tIteration: {}\tJob throughput: {:.1f} TFLOP/s/GPU\tCumulative throughput: "
                     "{:.1f} TFLOP/s/GPU\tFloating-point operations: {:.2e}\tTokens (in billions): {:.2f}",
                     iteration, job, cumulative, flops_so_far, tokens / 1e9));
}

void ProgressLog::append(const std::string& event) {
  const std::string line = fmt::format("{}\tJob ID: {}\t# GPUs: {}\t{}\n", local_seconds(std::chrono::system_clock::now()),
                                       job_id_, world_size_, event);
  std::FILE* f = std::fopen(path_.c_str(), "ab");
  if (!f) fail_errno(path_, "open", errno);
  const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size() && std::fflush(f) == 0;
  std::fclose(f);
  if (!ok) fail_errno(path_, "write", errno);
}

}  // namespace dlm::train
