// --log-progress: Megatron-LM's progress.txt in the --save folder (megatron/training/utils/log_utils.py
// append_to_progress_log, training.py compute_throughputs_and_append_to_progress_log and
// get_start_time_from_progress_log, at Megatron-LM d98e8a64), so that the scripts that read it keep working.
// Each line, appended:
//   "%Y-%m-%d %H:%M:%S\tJob ID: <SLURM_JOB_ID or empty>\t# GPUs: <world size>\t<event>"
// with the events
//   "Starting job"                                          at start-up
//   "Saved checkpoint\tIteration: N\tJob throughput: %.1f TFLOP/s/GPU\tCumulative throughput: %.1f TFLOP/s/GPU\t"
//   "Floating-point operations: %.2e\tTokens (in billions): %.2f"        after each checkpoint is committed
// Job throughput: the FLOPs of this job's iterations over its wall time since start-up, per GPU. Cumulative
// throughput: the FLOPs since the first "Starting job" of the latest unbroken run of lines with this world size
// (and the FLOP count of the last checkpoint saved before it), over the wall time since that line.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dlm::train {

class ProgressLog {
 public:
  // Appends "Starting job" to DIR/progress.txt (creating DIR); `flops_at_start`: the FLOPs of the iterations
  // the run resumes after.
  ProgressLog(std::string dir, std::string job_id, int world_size, double flops_at_start);
  // Appends the "Saved checkpoint" line for a checkpoint of `iteration` holding `flops_so_far` FLOPs and `tokens`.
  void saved_checkpoint(std::int64_t iteration, double flops_so_far, double tokens);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event);
  std::string path_, job_id_;
  int world_size_;
  double flops_at_start_;
  std::chrono::system_clock::time_point started_;
};

}  // namespace dlm::train
