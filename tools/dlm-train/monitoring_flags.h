// dlm-train's monitoring flags, Megatron's names and meanings (training_monitor.h has what each writes):
// --log-throughput, --log-params-norm, --log-num-zeros-in-grad, --log-progress (progress.txt in --save),
// --log-timers-to-tensorboard, --log-memory-to-tensorboard (host memory), --log-validation-ppl-to-tensorboard,
// --tensorboard-log-interval, --tensorboard-queue-size, and the W&B flags.
//
// W&B: dlm-train does not link W&B. --wandb-project makes the run write TensorBoard events (into --tensorboard-dir,
// or <wandb dir>/tensorboard without it; the wandb dir is --wandb-save-dir, else <--save>/wandb as Megatron's) and
// prints one start-up line with the command that uploads them:
//   [WANDB_DIR=<wandb dir>] wandb sync --sync-tensorboard -p <project> [-e <entity>] [--id <run id>] <tensorboard dir>
// The run id is --wandb-run-id (MegaDLMs), else --wandb-exp-name (`wandb sync` names no run otherwise).
// --wandb-mode disabled (MegaDLMs) turns all of it off.
#pragma once

#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/trainer.h"

namespace dlm::tools {

struct MonitoringFlags {
  bool log_progress = false;
  std::string wandb_project, wandb_exp_name, wandb_save_dir, wandb_entity, wandb_run_id, wandb_mode = "online";
};

// Registers the flags into `d`, writing to `options.monitor`, `options.tensorboard_dir` and `flags`.
void add_monitoring_flags(boost::program_options::options_description& d, train::TrainerOptions& options,
                          MonitoringFlags& flags);
// After parsing: checks the values (dlm::Error naming the flag), fills in the progress folder (from `save`), the
// TensorBoard folder W&B reads and the Job ID, and appends the `wandb sync` line to `notices`. Returns the folder
// `wandb sync` runs in ("" without W&B); dlm-train creates it at start-up.
std::string apply_monitoring_flags(const MonitoringFlags& flags, const std::string& save, train::TrainerOptions& options,
                                   std::vector<std::string>& notices);
// Once the model is known: the job's ranks and Megatron's FLOP count of an iteration (throughput, progress.txt).
void set_job_shape(const ckpt::ModelConfig& model, int world_size, train::TrainerOptions& options);

}  // namespace dlm::tools
