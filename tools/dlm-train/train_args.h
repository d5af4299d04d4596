// dlm-train's command line: Megatron's flag names (and MegaDLMs' diffusion flags) into the library's
// option structs. Every check that needs no data runs here, before anything is read or computed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/data/tokenizer.h"
#include "dlm/train/cuda_options.h"
#include "dlm/train/trainer.h"

namespace dlm::tools {

struct TrainArgs {
  ckpt::ModelConfig model;
  std::string model_config_file;   // --model-config: dlm JSON or a Hugging Face config.json
  train::TrainerOptions trainer;
  std::vector<std::string> data_path;  // --data-path [weight] prefix ...
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;  // --train-data-path ... (per split)
  std::string data_args_path;           // --data-args-path: a file of the --data-path words (read with the data)
  std::string per_split_data_args_path; // --per-split-data-args-path: JSON of the three splits' words
  bool mock_data = false;               // --mock-data: megatron-core's MockGPTDataset samples (dlm/data/mock_dataset.h)
  std::string split = "969,30,1";      // --split
  std::string data_cache_path;         // --data-cache-path
  data::TokenizerOptions tokenizer;
  std::string save, load;              // --save, --load
  bool no_load_optim = false;          // --no-load-optim: weights and progress from --load, fresh AdamW moments
  bool finetune = false;               // --finetune: weights only from --load, iteration 0, fresh moments
  bool use_checkpoint_args = false;    // --use-checkpoint-args: the model's shape from the --load checkpoint
  bool async_save = false;             // --async-save: checkpoints written in the background
  bool non_persistent = false;         // --non-persistent-ckpt-type global: --load also looks at the non-persistent folder
  std::string non_persistent_dir;      // --non-persistent-global-ckpt-dir ("": --save/non_persistent, --load/non_persistent)
  double exit_duration_minutes = 0;    // --exit-duration-in-mins (0: none): stop and save after this wall time
  std::optional<std::int64_t> train_samples;  // --train-samples (trainer.train_iters is then samples / global batch)
  std::uint64_t seed = 1234;           // --seed
  bool vocab_size_given = false;       // --vocab-size was set (else: the tokenizer's, or the model config's)
  bool norm_epsilon_given = false;     // --norm-epsilon was set (else Megatron's 1e-5, or a --load checkpoint's)
  bool bf16 = false;                   // --bf16 (the CPU backend computes in fp32 regardless)
  int threads = 0;                     // --threads (0: all cores)
  std::string device;                  // --device cpu|cuda ("": cuda when built with it and a GPU is there)
  train::CudaOptions cuda;             // --deterministic-mode, --cuda-attention, --cuda-profile
  bool staged_device_groups = false;   // --device-groups staged: GPU groups through host memory (tests on one GPU)
  // Parallelism (docs/parallelism.md); the data-parallel size is the launcher's ranks / (TP x PP).
  int tensor_parallel = 1;             // --tensor-model-parallel-size
  int pipeline_parallel = 1;           // --pipeline-model-parallel-size
  int expert_parallel = 1;             // --expert-model-parallel-size (moe_flags.h)
  bool sequence_parallel = false;      // --sequence-parallel
  int layers_per_virtual_stage = 0;    // --num-layers-per-virtual-pipeline-stage (0: not interleaved)
  bool overlap_param_gather = false;   // --overlap-param-gather
  double timeout_minutes = 10;         // --distributed-timeout-minutes
  bool recompute_full = false;         // --recompute-granularity full
  bool dry_run = false;                // --dry-run: print each rank's memory and traffic, allocate nothing
  int world_size = 0;                  // --world-size: the ranks a dry run plans for (0: the launcher's)
  bool help = false;
  std::string wandb_dir;               // the folder of the `wandb sync` command (--wandb-save-dir), made at start-up
  // Lines for the log at start-up: Megatron flags that change nothing in dlm, where checkpoints go
  // (--ckpt-format), the `wandb sync` command for --wandb-project.
  std::vector<std::string> notices;
};

// Parses argv; throws boost::program_options::error for usage errors and dlm::Error for values that
// cannot be (heads not dividing hidden, KV heads not dividing heads, sequence beyond the position table...).
TrainArgs parse_train_args(int argc, char** argv);
std::string train_usage();

}  // namespace dlm::tools
