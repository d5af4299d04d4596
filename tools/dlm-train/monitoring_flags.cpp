#include "monitoring_flags.h"

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/flops.h"

namespace po = boost::program_options;

namespace dlm::tools {

void add_monitoring_flags(po::options_description& d, train::TrainerOptions& t, MonitoringFlags& f) {
  auto& m = t.monitor;
  d.add_options()
      ("log-throughput", po::bool_switch(&m.log_throughput), "TFLOP/s per GPU in the log line (Megatron's FLOP count)")
      ("log-params-norm", po::bool_switch(&m.log_params_norm), "the weights' L2 norm in the log line and TensorBoard")
      ("log-num-zeros-in-grad", po::bool_switch(&m.log_num_zeros_in_grad), "the zeros of the summed gradient in the log line and TensorBoard")
      ("log-progress", po::bool_switch(&f.log_progress), "append Megatron's progress.txt in --save (job start, each checkpoint: throughput, FLOPs, tokens)")
      ("log-timers-to-tensorboard", po::bool_switch(&m.log_timers_to_tensorboard), "iteration-time (and throughput with --log-throughput) to TensorBoard")
      ("log-memory-to-tensorboard", po::bool_switch(&m.log_memory_to_tensorboard), "memory to TensorBoard under Megatron's mem-* tags: on the GPU the device's memory in use and the model's allocation; on the CPU backend the process's host memory (resident, malloc'd, peak resident)")
      ("log-validation-ppl-to-tensorboard", po::bool_switch(&m.log_validation_ppl_to_tensorboard), "validation perplexity to TensorBoard")
      ("tensorboard-log-interval", po::value(&m.tensorboard_log_interval)->default_value(m.tensorboard_log_interval), "iterations between TensorBoard scalars")
      ("tensorboard-queue-size", po::value(&m.tensorboard_queue_size)->default_value(m.tensorboard_queue_size), "TensorBoard events held before a write (also written at each log line)")
      ("wandb-project", po::value(&f.wandb_project), "W&B project: dlm writes TensorBoard events and prints the `wandb sync --sync-tensorboard` command that uploads them")
      ("wandb-exp-name", po::value(&f.wandb_exp_name), "W&B run id in that command (when no --wandb-run-id)")
      ("wandb-save-dir", po::value(&f.wandb_save_dir), "the folder `wandb sync` runs in (WANDB_DIR; default <--save>/wandb); TensorBoard events go to its tensorboard/ without --tensorboard-dir")
      ("wandb-entity", po::value(&f.wandb_entity), "W&B entity, in that command")
      ("wandb-run-id", po::value(&f.wandb_run_id), "W&B run id, in that command")
      ("wandb-mode", po::value(&f.wandb_mode)->default_value(f.wandb_mode), "online | offline | disabled (disabled: no W&B command, no events for it)");
}

std::string apply_monitoring_flags(const MonitoringFlags& f, const std::string& save, train::TrainerOptions& t,
                                   std::vector<std::string>& notices) {
  auto& m = t.monitor;
  if (m.tensorboard_log_interval < 1)
    fail(fmt::format("--tensorboard-log-interval {} must be positive", m.tensorboard_log_interval));
  if (m.tensorboard_queue_size < 1)
    fail(fmt::format("--tensorboard-queue-size {} must be positive", m.tensorboard_queue_size));
  if (f.log_progress) {
    if (save.empty()) fail("--log-progress writes progress.txt in the --save folder: give --save");
    m.progress_dir = save;
  }
  // Megatron's progress.txt names the Slurm job; empty elsewhere, as there.
  if (const char* job = std::getenv("SLURM_JOB_ID")) m.job_id = job;
  if (f.wandb_mode != "online" && f.wandb_mode != "offline" && f.wandb_mode != "disabled")
    fail(fmt::format("--wandb-mode {}: not online, offline or disabled", f.wandb_mode));
  if (f.wandb_project.empty() || f.wandb_mode == "disabled") return "";
  std::string wandb_dir = f.wandb_save_dir;
  if (wandb_dir.empty() && !save.empty()) wandb_dir = (std::filesystem::path(save) / "wandb").string();
  if (t.tensorboard_dir.empty()) {
    if (wandb_dir.empty())
      fail(fmt::format("--wandb-project {}: dlm writes TensorBoard events for W&B into a folder: give --wandb-save-dir, "
                       "--save or --tensorboard-dir", f.wandb_project));
    t.tensorboard_dir = (std::filesystem::path(wandb_dir) / "tensorboard").string();
  }
  const std::string& id = f.wandb_run_id.empty() ? f.wandb_exp_name : f.wandb_run_id;
  notices.push_back(fmt::format(
      "--wandb-project {}: dlm-train does not link W&B; it writes TensorBoard events to {}, which this command "
      "uploads: {}wandb sync --sync-tensorboard -p {}{}{} {}",
      f.wandb_project, t.tensorboard_dir, wandb_dir.empty() ? "" : "WANDB_DIR=" + wandb_dir + " ", f.wandb_project,
      f.wandb_entity.empty() ? "" : " -e " + f.wandb_entity, id.empty() ? "" : " --id " + id, t.tensorboard_dir));
  return wandb_dir;
}

void set_job_shape(const ckpt::ModelConfig& model, int world_size, train::TrainerOptions& t) {
  t.monitor.world_size = world_size;
  t.monitor.flops_per_iteration = train::megatron_flops_per_iteration(
      {model.num_layers, model.hidden_size, model.ffn_hidden_size, model.num_attention_heads, model.num_query_groups,
       model.kv_channels, model.padded_vocab_size(), t.seq_length, t.global_batch_size});
}

}  // namespace dlm::tools
