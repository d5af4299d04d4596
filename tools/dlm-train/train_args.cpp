#include "train_args.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include "cuda_flags.h"
#include "dlm/common/error.h"
#include "dlm/train/parallel.h"
#include "fp8_flags.h"
#include "megatron_flags.h"
#include "monitoring_flags.h"
#include "moe_flags.h"
#include "tokenizer_flags.h"
#include "dlm/common/thread_pool.h"
#include "flag_checks.h"

namespace po = boost::program_options;

namespace dlm::tools {
namespace {

struct Raw {
  std::int64_t kv_channels = 0, lr_decay_iters = 0, num_query_groups = 0;
  std::string on_nan = "stop", recompute, device_groups = "nccl";
  std::string lr_decay_style = "linear", wsd_style = "exponential", mode = "difflm-noshift", schedule = "",
              attention = "";
  std::int32_t mask_token = -1;
  std::string ckpt_format, non_persistent_type, non_persistent_dir;
  MonitoringFlags monitoring;
  std::int64_t non_persistent_interval = 0;
  std::int64_t train_samples = 0, warmup_samples = 0, decay_samples = 0, wsd_decay_samples = 0;
  double warmup_fraction = -1;
  std::string checkpoint_steps;
  bool untie = false, qk_layernorm = false, group_query_attention = false;
  MoeFlags moe;
  Fp8Flags fp8;
};

po::options_description describe(TrainArgs& a, Raw& r) {
  auto& m = a.model;
  auto& t = a.trainer;
  po::options_description model("model (Megatron's flags)");
  model.add_options()
      ("model-config", po::value(&a.model_config_file), "model shape from a dlm JSON or Hugging Face config.json")
      ("num-layers", po::value(&m.num_layers)->default_value(m.num_layers), "transformer layers")
      ("hidden-size", po::value(&m.hidden_size)->default_value(m.hidden_size), "hidden size")
      ("ffn-hidden-size", po::value(&m.ffn_hidden_size)->default_value(m.ffn_hidden_size), "SwiGLU FFN size")
      ("num-attention-heads", po::value(&m.num_attention_heads)->default_value(m.num_attention_heads), "heads")
      ("group-query-attention", po::bool_switch(&r.group_query_attention), "use --num-query-groups KV heads")
      ("num-query-groups", po::value(&r.num_query_groups), "KV heads (GQA)")
      ("kv-channels", po::value(&r.kv_channels), "head dim (default hidden / heads)")
      ("max-position-embeddings", po::value(&m.max_position_embeddings)->default_value(m.max_position_embeddings), "position table")
      ("rotary-base", po::value(&m.rotary_base)->default_value(m.rotary_base), "RoPE theta")
      ("norm-epsilon", po::value(&m.norm_epsilon)->default_value(1e-5), "RMSNorm eps (a --load checkpoint's when not given)")
      ("qk-layernorm", po::bool_switch(&r.qk_layernorm), "RMSNorm over each head's q and k")
      ("untie-embeddings-and-output-weights", po::bool_switch(&r.untie), "separate output layer")
      ("init-method-std", po::value(&m.init_method_std)->default_value(m.init_method_std), "init std")
      ("make-vocab-size-divisible-by", po::value(&m.make_vocab_size_divisible_by)->default_value(m.make_vocab_size_divisible_by), "vocab padding")
      ("attention-mask-type", po::value(&r.attention), "no_mask (bidirectional) | causal")
      ("bf16", po::bool_switch(&a.bf16), "bf16 mixed precision (GPU backend; the CPU backend is fp32)");
  po::options_description moe("mixture of experts (Megatron's flags; docs/moe.md)");
  add_moe_flags(moe, r.moe);
  po::options_description objective("objective (MegaDLMs' flags)");
  objective.add_options()
      ("model-running-mode", po::value(&r.mode)->default_value(r.mode), "difflm-noshift | vanilla (AR)")
      ("difflm-mask-schedule", po::value(&r.schedule), "llada: LLaDA's variant of the loss")
      ("mask-token", po::value(&r.mask_token), "mask id (default: the tokenizer's <|mask_token|>)")
      ("difflm-varilen-prob", po::value(&t.objective.varilen_prob)->default_value(t.objective.varilen_prob), "variable-length probability")
      ("eod-mask-loss", po::bool_switch(&t.eod_mask_loss), "no loss on eod labels");
  po::options_description training("training");
  training.add_options()
      ("seq-length", po::value(&t.seq_length)->required(), "sequence length")
      ("micro-batch-size", po::value(&t.micro_batch_size)->default_value(t.micro_batch_size), "micro-batch")
      ("global-batch-size", po::value(&t.global_batch_size)->default_value(t.global_batch_size, "micro x DP"), "global batch (accumulated); Megatron's default: one micro-batch per data-parallel rank")
      ("train-iters", po::value(&t.train_iters), "iterations (or --train-samples)")
      ("train-samples", po::value(&r.train_samples), "samples to train on (Megatron: iterations = samples / --global-batch-size; the schedule then in samples)")
      ("lr", po::value(&t.lr.max_lr)->default_value(t.lr.max_lr), "peak learning rate")
      ("min-lr", po::value(&t.lr.min_lr)->default_value(t.lr.min_lr), "final learning rate")
      ("lr-warmup-iters", po::value(&t.lr.warmup_iters)->default_value(0), "warmup iterations")
      ("lr-warmup-init", po::value(&t.lr.init_lr)->default_value(0.0), "learning rate at step 0")
      ("lr-decay-iters", po::value(&r.lr_decay_iters), "decay iterations (default --train-iters)")
      ("lr-decay-style", po::value(&r.lr_decay_style)->default_value(r.lr_decay_style), "constant | linear | cosine | inverse-square-root | WSD")
      ("lr-wsd-decay-style", po::value(&r.wsd_style)->default_value(r.wsd_style), "linear | cosine | exponential | minus_sqrt")
      ("lr-wsd-decay-iters", po::value(&t.lr.wsd_decay_iters)->default_value(0), "WSD tail iterations")
      ("lr-warmup-samples", po::value(&r.warmup_samples), "warmup samples (with --train-samples)")
      ("lr-decay-samples", po::value(&r.decay_samples), "decay samples (with --train-samples; default: --train-samples)")
      ("lr-wsd-decay-samples", po::value(&r.wsd_decay_samples), "WSD tail samples (with --train-samples)")
      ("lr-warmup-fraction", po::value(&r.warmup_fraction), "warmup as a fraction of the decay (instead of --lr-warmup-iters/-samples)")
      ("weight-decay", po::value(&t.adam.weight_decay)->default_value(t.adam.weight_decay), "AdamW decay (none on norms)")
      ("adam-beta1", po::value(&t.adam.beta1)->default_value(t.adam.beta1), "")
      ("adam-beta2", po::value(&t.adam.beta2)->default_value(t.adam.beta2), "")
      ("adam-eps", po::value(&t.adam.eps)->default_value(t.adam.eps), "")
      ("clip-grad", po::value(&t.clip_grad)->default_value(t.clip_grad), "global gradient-norm limit")
      ("on-nan", po::value(&r.on_nan)->default_value(r.on_nan), "a NaN/Inf loss or grad norm: stop (after saving the last good state) | skip the update")
      ("seed", po::value(&a.seed)->default_value(a.seed), "initialisation, data and noise seed")
      ("threads", po::value(&a.threads)->default_value(0), "CPU threads (0: all cores)")
      ("device", po::value(&a.device), "cpu | cuda (default: cuda when dlm has the CUDA backend and a GPU is present)");
  po::options_description parallel("parallelism (Megatron's flags; launch under mpirun or srun)");
  parallel.add_options()
      ("tensor-model-parallel-size", po::value(&a.tensor_parallel)->default_value(1), "TP size: heads, ffn and vocabulary split over ranks")
      ("pipeline-model-parallel-size", po::value(&a.pipeline_parallel)->default_value(1), "PP size: layers split into stages (1F1B)")
      ("num-layers-per-virtual-pipeline-stage", po::value(&a.layers_per_virtual_stage)->default_value(0), "interleaved 1F1B: layers per model chunk")
      ("sequence-parallel", po::bool_switch(&a.sequence_parallel), "split norms and residuals along the sequence (with TP)")
      ("overlap-grad-reduce", po::bool_switch(&t.overlap_grad_reduce), "reduce each gradient bucket as soon as the last backward completes it")
      ("overlap-param-gather", po::bool_switch(&a.overlap_param_gather), "all-gather updated weights during the next forward (GPU)")
      ("use-distributed-optimizer", po::bool_switch(&t.use_distributed_optimizer), "shard the AdamW moments over the data-parallel ranks")
      ("ddp-bucket-size", po::value(&t.ddp_bucket_size)->default_value(t.ddp_bucket_size), "gradient elements per reduction bucket")
      ("distributed-timeout-minutes", po::value(&a.timeout_minutes)->default_value(a.timeout_minutes), "a collective waiting longer names the lost rank and exits")
      ("recompute-granularity", po::value(&r.recompute), "full: keep only each layer's input and run its forward again in the backward (--device cuda; the CPU backend keeps every activation)")
      ("dry-run", po::bool_switch(&a.dry_run), "print each rank's memory and communication per step, allocate nothing")
      ("world-size", po::value(&a.world_size)->default_value(0), "ranks the dry run plans for (default: the launcher's)");
  po::options_description gpu("GPU backend (--device cuda)");
  add_cuda_flags(gpu, a.cuda, CudaFlagsFor::kTraining);
  add_fp8_flags(gpu, r.fp8);
  gpu.add_options()("device-groups", po::value(&r.device_groups)->default_value(r.device_groups),
                    "nccl | staged: the model's groups over NCCL, one GPU a rank; or staged through host memory so "
                    "that several ranks share one GPU (for tests of parallel layouts on one GPU; slow, and data "
                    "parallelism only with --use-distributed-optimizer or --overlap-grad-reduce)");
  po::options_description data("data");
  data.add_options()
      ("data-path", po::value(&a.data_path)->multitoken(), "[weight] prefix ... (dlm-preprocess output)")
      ("train-data-path", po::value(&a.train_data_path)->multitoken(), "[weight] prefix ... of the training split (--split then unused)")
      ("valid-data-path", po::value(&a.valid_data_path)->multitoken(), "[weight] prefix ... of the validation split")
      ("test-data-path", po::value(&a.test_data_path)->multitoken(), "[weight] prefix ... of the test split")
      ("data-args-path", po::value(&a.data_args_path), "a file holding the --data-path words")
      ("per-split-data-args-path", po::value(&a.per_split_data_args_path), R"(a JSON file {"train": ..., "valid": ..., "test": ...} of the per-split words)")
      ("mock-data", po::bool_switch(&a.mock_data), "megatron-core's mock samples (MockGPTDataset) instead of data files; needs --tokenizer-type")
      ("split", po::value(&a.split)->default_value(a.split), "train,valid,test weights")
      ("data-cache-path", po::value(&a.data_cache_path), "where the sample indices are cached");
  add_tokenizer_flags(data, a.tokenizer);
  po::options_description io("checkpoints and logging");
  io.add_options()
      ("save", po::value(&a.save), "checkpoint folder to write")
      ("load", po::value(&a.load), "checkpoint folder to resume from")
      ("save-interval", po::value(&t.save_interval)->default_value(0), "save every N iterations")
      ("exit-interval", po::value(&t.exit_interval)->default_value(0), "save and exit at a multiple of N")
      ("checkpoint-steps", po::value(&r.checkpoint_steps), "MegaDLMs: also save after these iterations (comma-separated, e.g. 100,200)")
      ("exit-duration-in-mins", po::value(&a.exit_duration_minutes)->default_value(0), "save and exit after the step that passes N minutes since start (0: never)")
      ("no-load-optim", po::bool_switch(&a.no_load_optim), "--load the weights and the iteration, start the AdamW moments afresh")
      ("finetune", po::bool_switch(&a.finetune), "--load the weights only: iteration 0, fresh AdamW moments")
      ("use-checkpoint-args", po::bool_switch(&a.use_checkpoint_args), "the model's shape from the --load checkpoint, over the shape flags (none there: the flags')")
      ("ckpt-format", po::value(&r.ckpt_format), "torch | torch_dist | zarr | fsdp_dtensor: dlm writes its own format (HDF5) whichever is named, and says so at start-up")
      ("non-persistent-save-interval", po::value(&r.non_persistent_interval), "also save every N iterations into --non-persistent-global-ckpt-dir, keeping only the newest there (needs --non-persistent-ckpt-type global)")
      ("non-persistent-ckpt-type", po::value(&r.non_persistent_type), "global (dlm's only kind: a checkpoint folder on a shared file system)")
      ("non-persistent-global-ckpt-dir", po::value(&r.non_persistent_dir), "where non-persistent checkpoints go (default: --save/non_persistent, as Megatron); --load reads the newer of the two")
      ("async-save", po::bool_switch(&a.async_save), "write checkpoints in the background: the save point copies the state to host memory and training goes on (still crash-safe)")
      ("eval-interval", po::value(&t.eval_interval)->default_value(1000), "validate every N iterations (0: only at the end)")
      ("eval-iters", po::value(&t.eval_iters)->default_value(100), "global batches per evaluation (0: no evaluation)")
      ("full-validation", po::bool_switch(&t.full_validation), "each evaluation the whole validation split (one epoch of it, every sample once) rather than --eval-iters batches")
      ("log-interval", po::value(&t.log_interval)->default_value(100), "iterations per log line")
      ("tensorboard-dir", po::value(&t.tensorboard_dir), "TensorBoard event files")
      ("metrics-file", po::value(&t.metrics_path), "JSONL metrics")
      ("help,h", po::bool_switch(&a.help), "this help");
  add_monitoring_flags(io, t, r.monitoring);
  po::options_description as_is("Megatron flags that state what dlm does (another value fails, naming it)");
  po::options_description no_effect("Megatron flags accepted with no effect in dlm (named in a start-up line)");
  po::options_description refused("Megatron flags dlm refuses (the error says what to use instead)");
  add_megatron_surface(as_is, no_effect, refused);
  po::options_description all(
      "dlm-train: train a diffusion (or AR) language model from .bin/.idx data.\n"
      "A flag given twice: the last one wins (Megatron's argparse rule).");
  all.add(model).add(moe).add(objective).add(training).add(parallel).add(gpu).add(data).add(io).add(as_is).add(no_effect).add(refused);
  return all;
}

// Every numeric flag's range, before anything reads it; a value out of range is a usage error naming the
// flag (Megatron asserts most of these; the limits above Megatron's keep sizes from overflowing).
void check_ranges(const TrainArgs& a, const Raw& r, const po::variables_map& vm) {
  const auto& m = a.model;
  const auto& t = a.trainer;
  constexpr std::int64_t kBig = std::int64_t{1} << 40;
  in_range("num-layers", m.num_layers, 1, 100000);
  in_range("hidden-size", m.hidden_size, 1, 1 << 20);
  in_range("ffn-hidden-size", m.ffn_hidden_size, 1, 1 << 22);
  in_range("num-attention-heads", m.num_attention_heads, 1, 1 << 16);
  in_range("num-query-groups", r.num_query_groups, 0, 1 << 16);
  in_range("kv-channels", r.kv_channels, 0, 1 << 16);
  in_range("max-position-embeddings", m.max_position_embeddings, 1, 1 << 24);
  positive("rotary-base", m.rotary_base);
  positive("norm-epsilon", m.norm_epsilon);
  in_range("init-method-std", m.init_method_std, 0, 1e6);
  in_range("make-vocab-size-divisible-by", m.make_vocab_size_divisible_by, 1, 1 << 16);
  if (a.tokenizer.vocab_size) in_range("vocab-size", *a.tokenizer.vocab_size, 0, std::int64_t{1} << 31);
  if (vm.count("mask-token")) in_range("mask-token", r.mask_token, 0, std::numeric_limits<std::int32_t>::max());
  in_range("difflm-varilen-prob", t.objective.varilen_prob, 0, 1);
  in_range("seq-length", t.seq_length, 1, 1 << 24);
  in_range("micro-batch-size", t.micro_batch_size, 1, 1 << 20);
  in_range("global-batch-size", t.global_batch_size, 1, 1 << 30);
  in_range("train-iters", t.train_iters, 1, kBig);
  in_range("lr", t.lr.max_lr, 0, 1e6);
  in_range("min-lr", t.lr.min_lr, 0, 1e6);
  in_range("lr-warmup-init", t.lr.init_lr, 0, 1e6);
  in_range("lr-warmup-iters", t.lr.warmup_iters, 0, kBig);
  in_range("lr-decay-iters", r.lr_decay_iters, 0, kBig);
  in_range("lr-wsd-decay-iters", t.lr.wsd_decay_iters, 0, kBig);
  in_range("weight-decay", t.adam.weight_decay, 0, 1e6);
  in_range("adam-beta1", t.adam.beta1, 0, 0.999999999);
  in_range("adam-beta2", t.adam.beta2, 0, 0.999999999);
  positive("adam-eps", t.adam.eps);
  in_range("clip-grad", t.clip_grad, 0, 1e30);
  in_range("threads", a.threads, 0, static_cast<int>(kMaxThreads));
  in_range("tensor-model-parallel-size", a.tensor_parallel, 1, 1 << 16);
  in_range("pipeline-model-parallel-size", a.pipeline_parallel, 1, 1 << 16);
  in_range("num-layers-per-virtual-pipeline-stage", a.layers_per_virtual_stage, 0, 100000);
  in_range("ddp-bucket-size", t.ddp_bucket_size, 1, kBig);
  in_range("distributed-timeout-minutes", a.timeout_minutes, 1e-3, 1e6);
  in_range("world-size", a.world_size, 0, 1 << 24);
  in_range("save-interval", t.save_interval, 0, kBig);
  in_range("exit-interval", t.exit_interval, 0, kBig);
  in_range("eval-interval", t.eval_interval, 0, kBig);
  in_range("eval-iters", t.eval_iters, 0, kBig);
  in_range("log-interval", t.log_interval, 1, kBig);
}

// Megatron's two ways to give the length and the LR schedule (training.py, get_optimizer_param_scheduler): in
// iterations (--train-iters, --lr-*-iters) or in samples (--train-samples, --lr-*-samples; iterations = samples /
// global batch, rounded down), with --lr-warmup-fraction of the decay in either. The schedule (lr_schedule.h) counts
// samples as Megatron's does, so a count that is not a multiple of the global batch is Megatron's too.
void training_length_and_schedule(TrainArgs& a, const Raw& r, const po::variables_map& vm) {
  auto& t = a.trainer;
  in_range("micro-batch-size", t.micro_batch_size, 1, 1 << 20);  // before it sizes the default global batch
  // Megatron's default global batch: one micro-batch per data-parallel rank (the ranks the launcher started, or
  // --world-size for a dry run, over TP x PP).
  if (vm["global-batch-size"].defaulted()) {
    const int world = a.world_size > 0 ? a.world_size : train::launch_info_from_environment().world_size;
    const int model = a.tensor_parallel * a.pipeline_parallel;
    t.global_batch_size = t.micro_batch_size * (model > 0 && world % model == 0 ? world / model : 1);
  }
  const std::int64_t g = t.global_batch_size;
  if (g <= 0) fail(fmt::format("--global-batch-size {} must be positive", g));
  const bool by_samples = vm.count("train-samples") > 0;
  if (by_samples == (vm.count("train-iters") > 0)) fail("give exactly one of --train-iters and --train-samples");
  const bool fraction = vm.count("lr-warmup-fraction") > 0;
  if (fraction && !(r.warmup_fraction >= 0 && r.warmup_fraction < 1))
    fail(fmt::format("--lr-warmup-fraction {} must be in [0, 1)", r.warmup_fraction));
  const char* other = nullptr;  // a flag of the other unit, which Megatron refuses too
  if (by_samples) {
    if (r.train_samples <= 0) fail(fmt::format("--train-samples {} must be positive", r.train_samples));
    t.train_iters = r.train_samples / g;
    if (t.train_iters == 0)
      fail(fmt::format("--train-samples {} is less than one --global-batch-size {}", r.train_samples, g));
    a.train_samples = r.train_samples;
    for (const char* f : {"lr-decay-iters", "lr-warmup-iters", "lr-wsd-decay-iters"})
      if (vm.count(f) && !vm[f].defaulted()) other = f;
    constexpr std::int64_t kBig = std::int64_t{1} << 52;  // exact as Megatron's float arithmetic needs
    in_range("lr-decay-samples", r.decay_samples, 0, kBig);
    in_range("lr-warmup-samples", r.warmup_samples, 0, kBig);
    in_range("lr-wsd-decay-samples", r.wsd_decay_samples, 0, kBig);
    t.lr.decay_samples = vm.count("lr-decay-samples") ? r.decay_samples : r.train_samples;
    t.lr.warmup_samples = static_cast<double>(r.warmup_samples);
    t.lr.wsd_decay_samples = r.wsd_decay_samples;
  } else {
    constexpr std::int64_t kBig = std::int64_t{1} << 40;
    in_range("train-iters", t.train_iters, 1, kBig);
    in_range("lr-warmup-iters", t.lr.warmup_iters, 0, kBig);
    in_range("lr-decay-iters", r.lr_decay_iters, 0, kBig);
    in_range("lr-wsd-decay-iters", t.lr.wsd_decay_iters, 0, kBig);
    for (const char* f : {"lr-decay-samples", "lr-warmup-samples", "lr-wsd-decay-samples"})
      if (vm.count(f)) other = f;
    t.lr.decay_iters = r.lr_decay_iters > 0 ? r.lr_decay_iters : t.train_iters;
  }
  if (other)
    fail(fmt::format("--{}: training is given in {} (--{}), so is the schedule", other,
                     by_samples ? "samples" : "iterations", by_samples ? "train-samples" : "train-iters"));
  if (fraction) {
    if (by_samples ? vm.count("lr-warmup-samples") > 0 : t.lr.warmup_iters != 0)
      fail(fmt::format("--lr-warmup-fraction and --lr-warmup-{}: give one", by_samples ? "samples" : "iters"));
    // Megatron's lr_warmup_steps = fraction * lr_decay_steps, a float of samples in either unit.
    t.lr.warmup_samples =
        r.warmup_fraction * static_cast<double>(by_samples ? *t.lr.decay_samples : t.lr.decay_iters * g);
  }
}

// MegaDLMs' --checkpoint-steps "100,200": the iterations after which to save (MegaDLMs itself ignores a list it cannot
// read, and saves before it counts the step, so its checkpoint named N holds N + 1 iterations; dlm refuses the
// former and saves after the named iteration).
std::set<std::int64_t> checkpoint_steps(const std::string& list, std::int64_t train_iters) {
  std::set<std::int64_t> steps;
  for (std::size_t at = 0; at < list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    const std::string word = list.substr(at, comma - at);
    at = comma + 1;
    if (word.empty()) continue;
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
    }
    if (used != word.size() || v < 1 || v > train_iters)
      fail(fmt::format("--checkpoint-steps {}: '{}' is not an iteration in [1, --train-iters {}]", list, word,
                       train_iters));
    steps.insert(v);
  }
  return steps;
}

// The checkpoint-format, non-persistent and W&B flags: validated, and what they mean for dlm put in a start-up line.
void megatron_checkpoint_and_logging(TrainArgs& a, const Raw& r) {
  const auto one_of = [](const std::string& v, std::initializer_list<const char*> ok) {
    for (const char* o : ok)
      if (v == o) return true;
    return false;
  };
  if (!r.ckpt_format.empty()) {
    if (!one_of(r.ckpt_format, {"torch", "torch_dist", "zarr", "fsdp_dtensor"}))
      fail(fmt::format("--ckpt-format {}: not torch, torch_dist, zarr or fsdp_dtensor", r.ckpt_format));
    a.notices.push_back(fmt::format(
        "--ckpt-format {}: checkpoints are dlm's own format (HDF5{}); `dlm-ckpt convert --from native --to hf "
        "{} OUT` makes a Hugging Face copy",
        r.ckpt_format, a.save.empty() ? "" : " under " + a.save, a.save.empty() ? "DIR" : a.save));
  }
  if (r.non_persistent_interval < 0)
    fail(fmt::format("--non-persistent-save-interval {} must be positive", r.non_persistent_interval));
  if (!r.non_persistent_type.empty() && r.non_persistent_type != "global")
    fail(fmt::format("--non-persistent-ckpt-type {}: dlm offers global only (checkpoints in --non-persistent-global-ckpt-dir, "
                     "default --save/non_persistent)", r.non_persistent_type));
  // Megatron's save points: every interval, beyond --train-iters never (the MegaDLMs script's 2 x TRAIN_ITERS).
  if (r.non_persistent_interval > 0 && r.non_persistent_interval <= a.trainer.train_iters) {
    if (r.non_persistent_type.empty())
      fail(fmt::format("--non-persistent-save-interval {} needs --non-persistent-ckpt-type global", r.non_persistent_interval));
    if (a.save.empty()) fail(fmt::format("--non-persistent-save-interval {} needs --save", r.non_persistent_interval));
    a.trainer.non_persistent_save_interval = r.non_persistent_interval;
  }
  a.non_persistent_dir = r.non_persistent_type.empty() ? "" : r.non_persistent_dir;
  a.non_persistent = !r.non_persistent_type.empty();
  a.wandb_dir = apply_monitoring_flags(r.monitoring, a.save, a.trainer, a.notices);
}

}  // namespace

std::string train_usage() {
  TrainArgs a;
  Raw r;
  std::ostringstream s;
  s << describe(a, r);
  return s.str();
}

TrainArgs parse_train_args(int argc, char** argv) {
  TrainArgs a;
  a.model.tie_word_embeddings = true;  // Megatron ties unless --untie-embeddings-and-output-weights
  Raw r;
  auto desc = describe(a, r);
  po::variables_map vm;
  const std::vector<std::string> args = last_occurrence_wins(argc, argv);
  const std::vector<std::string> words(args.begin() + 1, args.end());
  const po::parsed_options parsed = checked(po::command_line_parser(words).options(desc).run());
  // Boost drops a word that no flag takes; Megatron's argparse refuses it, and so does dlm-train.
  if (const auto stray = po::collect_unrecognized(parsed.options, po::include_positional); !stray.empty()) {
    const auto at = std::find(words.begin(), words.end(), stray.front());
    const auto flag = std::find_if(std::make_reverse_iterator(at), words.rend(),
                                   [](const std::string& w) { return w.rfind("-", 0) == 0; });
    fail(flag == words.rend() ? fmt::format("'{}' is not a flag", stray.front())
                              : fmt::format("'{}' after {}: not a value {} takes", stray.front(), *flag, *flag));
  }
  po::store(parsed, vm);
  for (const auto& arg : args)
    if (arg == "--help" || arg == "-h") {
      a.help = true;
      return a;
    }
  po::notify(vm);
  training_length_and_schedule(a, r, vm);
  a.norm_epsilon_given = !vm["norm-epsilon"].defaulted();
  check_ranges(a, r, vm);
  check_megatron_surface(vm);
  if (auto line = no_effect_notice(vm); !line.empty()) a.notices.push_back(std::move(line));
  megatron_checkpoint_and_logging(a, r);
  auto& m = a.model;
  auto& t = a.trainer;
  m.tie_word_embeddings = !r.untie;
  m.qk_layernorm = r.qk_layernorm;
  if (r.group_query_attention != (r.num_query_groups > 0))
    fail("--group-query-attention and --num-query-groups go together");
  m.num_query_groups = r.num_query_groups > 0 ? static_cast<int>(r.num_query_groups) : m.num_attention_heads;
  if (r.kv_channels > 0) {
    m.kv_channels = static_cast<int>(r.kv_channels);
  } else {
    if (m.num_attention_heads <= 0 || m.hidden_size % m.num_attention_heads != 0)
      fail(fmt::format("--num-attention-heads {} does not divide --hidden-size {} (or give --kv-channels)",
                       m.num_attention_heads, m.hidden_size));
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  }
  if (m.num_query_groups <= 0 || m.num_attention_heads % m.num_query_groups != 0)
    fail(fmt::format("--num-query-groups {} does not divide --num-attention-heads {}", m.num_query_groups,
                     m.num_attention_heads));
  apply_moe_flags(r.moe, vm, m);
  a.expert_parallel = r.moe.expert_parallel;
  check_expert_tensor_parallel(r.moe, a.tensor_parallel);
  // --vocab-size is the tokenizer's (NullTokenizer, TikTokenizer) and the model's vocabulary.
  // NullTokenizer's vocabulary is --vocab-size + 1 (its eod, the id one past), and Megatron sizes the model by it.
  if (a.tokenizer.vocab_size.value_or(0) > 0)
    m.vocab_size = static_cast<std::int64_t>(*a.tokenizer.vocab_size) + (a.tokenizer.type == "NullTokenizer" ? 1 : 0),
    a.vocab_size_given = true;
  if (r.mask_token >= 0) t.objective.mask_token = r.mask_token;
  if (!r.schedule.empty() && r.schedule != "llada")
    fail(fmt::format("--difflm-mask-schedule: '{}' is not llada", r.schedule));
  t.objective.kind = r.schedule == "llada" ? train::ObjectiveKind::kDiffusionLlada : train::parse_objective_kind(r.mode);
  const bool diffusion = t.objective.kind != train::ObjectiveKind::kAutoregressive;
  const std::string attention = r.attention.empty() ? (diffusion ? "no_mask" : "causal") : r.attention;
  if (attention == "no_mask") m.attention_mask = ckpt::AttentionMask::kBidirectional;
  else if (attention == "causal") m.attention_mask = ckpt::AttentionMask::kCausal;
  else fail(fmt::format("--attention-mask-type: '{}' is not no_mask or causal", attention));
  if (!diffusion && m.attention_mask != ckpt::AttentionMask::kCausal)
    fail("--model-running-mode vanilla trains next-token prediction: it needs --attention-mask-type causal");
  t.objective.seed = a.seed;
  t.lr.style = train::parse_lr_decay_style(r.lr_decay_style);
  t.on_non_finite = train::parse_non_finite_policy(r.on_nan);
  t.lr.wsd_style = train::parse_wsd_decay_style(r.wsd_style);
  t.lr.global_batch_size = t.global_batch_size;
  if (t.seq_length > m.max_position_embeddings)
    fail(fmt::format("--seq-length {} is longer than --max-position-embeddings {}", t.seq_length,
                     m.max_position_embeddings));
  if (!r.recompute.empty() && r.recompute != "full")
    fail(fmt::format("--recompute-granularity: '{}' is not full (selective recomputation is not implemented)", r.recompute));
  a.recompute_full = r.recompute == "full";
  a.cuda.fp8 = apply_fp8_flags(r.fp8);
  if (a.cuda.fp8.enabled && a.device == "cpu")
    fail("--fp8-format: the CPU backend has no FP8 training (train FP8 with --device cuda)");
  // The shape's layers are known here unless a config file or a checkpoint gives them (CudaModel checks again).
  if (a.model_config_file.empty() && a.load.empty()) a.cuda.fp8.validate(m.num_layers, a.pipeline_parallel);
  if (r.device_groups != "nccl" && r.device_groups != "staged")
    fail(fmt::format("--device-groups: '{}' is not nccl or staged", r.device_groups));
  a.staged_device_groups = r.device_groups == "staged";
  if (!(a.timeout_minutes > 0)) fail(fmt::format("--distributed-timeout-minutes {} must be positive", a.timeout_minutes));
  if (t.ddp_bucket_size < 1)
    fail(fmt::format("--ddp-bucket-size {} must be positive (gradient elements per bucket)", t.ddp_bucket_size));
  const bool per_split = !a.train_data_path.empty() || !a.valid_data_path.empty() || !a.test_data_path.empty();
  if (!a.data_path.empty() && per_split) fail("--data-path and --train-data-path/--valid-data-path/--test-data-path exclude each other");
  if (per_split && a.train_data_path.empty() && !a.dry_run) fail("--valid-data-path/--test-data-path need --train-data-path");
  // The files stand for the words (data_args_files.h) and are read with the data.
  if (!a.data_args_path.empty() && (!a.data_path.empty() || per_split || !a.per_split_data_args_path.empty()))
    fail("--data-args-path stands for --data-path: give it alone");
  if (!a.per_split_data_args_path.empty() && (!a.data_path.empty() || per_split))
    fail("--per-split-data-args-path stands for --train-data-path/--valid-data-path/--test-data-path: give it alone");
  const bool from_file = !a.data_args_path.empty() || !a.per_split_data_args_path.empty();
  if (a.mock_data && (!a.data_path.empty() || per_split || from_file))
    fail("--mock-data stands for the data: give no --data-path, --train-data-path, --data-args-path or "
         "--per-split-data-args-path with it");
  if (a.mock_data && a.tokenizer.type.empty())
    fail("--mock-data needs --tokenizer-type (e.g. NullTokenizer --vocab-size N): its vocabulary and eod make the "
         "mock tokens, as in Megatron");
  if (a.data_path.empty() && !per_split && !from_file && !a.mock_data && !a.dry_run)
    fail("--data-path (or --train-data-path) is required (a dlm-preprocess output prefix)");
  if (a.save.empty() && t.save_interval > 0) fail("--save-interval needs --save");
  t.checkpoint_steps = checkpoint_steps(r.checkpoint_steps, t.train_iters);
  if (a.save.empty() && !t.checkpoint_steps.empty()) fail("--checkpoint-steps needs --save");
  if (!(a.exit_duration_minutes >= 0))
    fail(fmt::format("--exit-duration-in-mins {} must be positive (0: no limit)", a.exit_duration_minutes));
  if ((a.finetune || a.no_load_optim || a.use_checkpoint_args) && a.load.empty())
    fail(fmt::format("{} needs --load", a.finetune ? "--finetune" : a.no_load_optim ? "--no-load-optim" : "--use-checkpoint-args"));
  return a;
}

}  // namespace dlm::tools
