// dlm-train's wiring: tokenizer -> model config -> sample indices -> model (CPU or GPU, --device) -> resume.
// Every check runs before the first parameter is allocated, so a bad run fails in milliseconds.
#include "pipeline.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "dlm/ckpt/checkpoint.h"
#include "dlm/ckpt/hf.h"
#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "dlm/data/blend_args.h"
#include "dlm/data/mock_dataset.h"
#include "dlm/data/sample_reader.h"
#include "dlm/train/checkpoint_saver.h"
#include "dlm/train/device.h"
#include "dlm/train/fp8.h"
#include "dlm/train/model.h"
#include "dlm/train/train_checkpoint.h"
#include "dlm/train/training_model.h"
#include "data_args_files.h"

namespace dlm::tools {
namespace {

// One split's samples (GPTDataset or BlendedDataset) as the trainer reads them: seq_length + 1 raw
// tokens. Megatron pads only past the very end of the data; a padded position reads as id 0, its
// embedding-safe value.
class SplitSource final : public train::SampleSource {
 public:
  explicit SplitSource(std::shared_ptr<const data::SplitDataset> split)
      : split_(std::move(split)), reader_(*split_, data::SampleOptions{}) {}
  std::uint64_t size() const override { return reader_.size(); }
  void read(std::uint64_t index, std::span<std::int32_t> tokens) const override {
    thread_local std::vector<std::int32_t> raw;
    reader_.raw_tokens(static_cast<std::size_t>(index), raw);
    if (raw.size() != tokens.size())
      fail(fmt::format("sample {}: {} tokens, the trainer wants {} (--seq-length + 1)", index, raw.size(), tokens.size()));
    for (std::size_t i = 0; i < raw.size(); ++i) tokens[i] = raw[i] < 0 ? 0 : raw[i];
  }

 private:
  std::shared_ptr<const data::SplitDataset> split_;
  data::SampleReader reader_;
};

// megatron-core's MockGPTDataset samples of one split (--mock-data).
class MockSource final : public train::SampleSource {
 public:
  explicit MockSource(std::shared_ptr<const data::MockGptDataset> split) : split_(std::move(split)) {}
  std::uint64_t size() const override { return split_->size(); }
  void read(std::uint64_t index, std::span<std::int32_t> tokens) const override {
    thread_local std::vector<std::int32_t> raw;
    split_->raw_tokens(static_cast<std::size_t>(index), raw);
    if (raw.size() != tokens.size())
      fail(fmt::format("mock sample {}: {} tokens, the trainer wants {} (--seq-length + 1)", index, raw.size(), tokens.size()));
    std::copy(raw.begin(), raw.end(), tokens.begin());
  }

 private:
  std::shared_ptr<const data::MockGptDataset> split_;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(fmt::format("{}: cannot open the model config", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A Hugging Face config.json names its model_type; dlm's own JSON has no such field.
ckpt::ModelConfig model_config_file(const std::string& path, int divisible_by) {
  const std::string text = read_text(path);
  if (text.find("\"model_type\"") != std::string::npos) return ckpt::model_config_from_hf_json(text, path, divisible_by);
  return ckpt::model_config_from_json(text, path);
}

void resolve_model_config(TrainArgs& args, TrainingSetup& setup) {
  ckpt::ModelConfig& m = args.model;
  if (!args.model_config_file.empty()) {
    const ckpt::AttentionMask mask = m.attention_mask;
    m = model_config_file(args.model_config_file, m.make_vocab_size_divisible_by);
    m.attention_mask = mask;  // the objective's flags decide the attention
    if (args.trainer.seq_length > m.max_position_embeddings)
      fail(fmt::format("--seq-length {} is longer than {}'s max_position_embeddings {}", args.trainer.seq_length,
                       args.model_config_file, m.max_position_embeddings));
  } else if (!args.vocab_size_given) {
    if (!setup.tokenizer) fail("the vocabulary is unknown: give --vocab-size, --tokenizer-type/--tokenizer-model or --model-config");
    m.vocab_size = static_cast<std::int64_t>(setup.tokenizer->vocab_size());
  }
  auto& objective = args.trainer.objective;
  if (objective.kind != train::ObjectiveKind::kAutoregressive) {
    if (objective.mask_token < 0 && m.mask_token_id) objective.mask_token = *m.mask_token_id;
    if (objective.mask_token < 0 && setup.tokenizer && setup.tokenizer->special_ids().mask)
      objective.mask_token = *setup.tokenizer->special_ids().mask;
    if (objective.mask_token < 0)
      fail("a diffusion objective needs a mask token: give --mask-token, or a tokenizer with <|mask_token|>");
    if (objective.mask_token >= m.vocab_size)
      fail(fmt::format("--mask-token {} is outside the vocabulary of {} ids", objective.mask_token, m.vocab_size));
    m.mask_token_id = objective.mask_token;
  }
  if (setup.tokenizer) {
    const auto& s = setup.tokenizer->special_ids();
    if (!m.eos_token_id) m.eos_token_id = s.eos ? s.eos : s.eod;
    if (!m.bos_token_id && s.bos) m.bos_token_id = s.bos;
    if (!m.pad_token_id && s.pad) m.pad_token_id = s.pad;
  }
  train::Model::check_config(m);
  setup.config = m;
}

struct Splits {
  std::array<std::optional<data::SplitDataset>, 3> splits;
};

// --mock-data: the three splits of megatron-core's MockGPTDataset, sized as Megatron sizes them, with the
// tokenizer's vocabulary and eod.
void open_mock_data(const TrainArgs& args, const data::MegatronDataArgs& d, TrainingSetup& setup) {
  const auto sizes = data::megatron_split_request(d);
  data::GptIndexConfig config;
  config.random_seed = d.seed;
  config.sequence_length = d.seq_length;
  const data::MockTokens tokens{static_cast<std::int64_t>(setup.tokenizer->vocab_size()), setup.tokenizer->eod()};
  const std::int64_t largest = std::max<std::int64_t>(tokens.vocab_size - 1, tokens.eod);
  if (largest >= setup.config.vocab_size)
    fail(fmt::format("--mock-data: the mock tokens reach id {}, but the model's vocabulary has {} ids", largest,
                     setup.config.vocab_size));
  auto splits = data::build_mock_datasets(sizes, config, tokens);
  const auto source = [&](std::size_t s) {
    return std::make_unique<MockSource>(std::make_shared<const data::MockGptDataset>(std::move(*splits[s])));
  };
  setup.train = source(0);
  if (args.trainer.eval_iters > 0 || args.trainer.full_validation) setup.valid = source(1);
  if (args.trainer.eval_iters > 0) setup.test = source(2);
  log::info("--mock-data: megatron-core's MockGPTDataset samples ({} train, {} valid, {} test)", setup.train->size(),
            setup.valid ? setup.valid->size() : 0, setup.test ? setup.test->size() : 0);
}

void open_data(const TrainArgs& args, TrainingSetup& setup, std::shared_ptr<Splits>& keep) {
  data::MegatronDataArgs d;
  d.data_path = args.data_path;
  d.train_data_path = args.train_data_path;
  d.valid_data_path = args.valid_data_path;
  d.test_data_path = args.test_data_path;
  if (!args.data_args_path.empty()) d.data_path = read_data_args(args.data_args_path);
  if (!args.per_split_data_args_path.empty()) {
    auto words = read_per_split_data_args(args.per_split_data_args_path);
    if (words[0].empty())
      fail(fmt::format("{}: \"train\" names no prefixes; the training split needs some (--per-split-data-args-path)",
                       args.per_split_data_args_path));
    d.train_data_path = std::move(words[0]);
    d.valid_data_path = std::move(words[1]);
    d.test_data_path = std::move(words[2]);
  }
  d.split = args.split;
  d.seq_length = static_cast<std::int32_t>(args.trainer.seq_length);
  // Megatron sizes the training split by --train-samples when given (the last partial batch's samples included).
  if (args.train_samples) d.train_samples = *args.train_samples;
  else d.train_iters = args.trainer.train_iters;
  d.global_batch_size = args.trainer.global_batch_size;
  d.eval_iters = args.trainer.eval_iters;
  d.full_validation = args.trainer.full_validation;
  // Megatron sizes the validation split by its eval interval (every evaluation plus the one at the end); dlm's
  // --eval-interval 0 evaluates only at the end.
  d.eval_interval = args.trainer.eval_interval > 0 ? args.trainer.eval_interval : args.trainer.train_iters + 1;
  d.seed = static_cast<std::uint32_t>(args.seed);
  if (!args.data_cache_path.empty()) d.data_cache_path = args.data_cache_path;
  if (args.mock_data) {
    open_mock_data(args, d, setup);
    return;
  }
  keep = std::make_shared<Splits>();
  keep->splits = data::build_datasets(data::builder_config(d));
  auto& train = keep->splits[0];
  if (!train || train->size() == 0) fail(fmt::format("--split {}: the training split is empty", args.split));
  // The split holds shared pointers of the datasets; the aliasing pointer keeps `keep` alive.
  setup.train = std::make_unique<SplitSource>(std::shared_ptr<const data::SplitDataset>(keep, &*train));
  // Megatron's do_valid and do_test: a non-empty split and --eval-iters > 0 (do_valid: or --full-validation);
  // without one it evaluates nothing.
  if (args.trainer.eval_iters > 0 || args.trainer.full_validation) {
    auto& valid = keep->splits[1];
    if (valid && valid->size() > 0)
      setup.valid = std::make_unique<SplitSource>(std::shared_ptr<const data::SplitDataset>(keep, &*valid));
    else
      log::info("no validation data ({}): no evaluation, as in Megatron",
                d.train_data_path.empty() ? fmt::format("--split {}", args.split) : std::string("no --valid-data-path"));
  }
  if (args.trainer.eval_iters > 0) {
    auto& test = keep->splits[2];
    if (test && test->size() > 0)
      setup.test = std::make_unique<SplitSource>(std::shared_ptr<const data::SplitDataset>(keep, &*test));
  }
  std::int64_t largest = -1;
  std::string where;
  for (const auto& split : keep->splits)
    if (split)
      for (const auto& gpt : split->datasets) {
        // A model whose vocabulary is smaller than the largest id, or any negative id, would index outside
        // its embedding table: both are checked before training rather than found as a crash.
        const data::TokenRange range = data::token_range(gpt->dataset());
        if (range.min < 0)
          fail(fmt::format("{}: offset {}: token id {} is negative, expected ids >= 0", data::bin_path(gpt->prefix()),
                           range.min_offset, range.min));
        if (range.max > largest) largest = range.max, where = data::bin_path(gpt->prefix());
      }
  if (largest >= setup.config.vocab_size)
    fail(fmt::format("{}: the data holds token id {}, but the vocabulary has {} ids (--vocab-size or the tokenizer)",
                     where, largest, setup.config.vocab_size));
}

// Whether `dir` holds a dlm checkpoint (its tracker `latest`, or a checkpoint folder itself); a folder with Megatron's
// tracker alone holds a Megatron checkpoint, which dlm-train does not read.
bool has_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(dir) / "latest") || fs::exists(fs::path(dir) / "metadata.json")) return true;
  if (fs::exists(fs::path(dir) / train::kMegatronTracker))
    fail(fmt::format("--load {}: a Megatron checkpoint ({} without dlm's latest); dlm-train reads dlm's format: "
                     "import it with dlm-ckpt first", dir, train::kMegatronTracker));
  return false;
}

// --use-checkpoint-args: the model's shape is the --load checkpoint's, whatever the shape flags say (Megatron's
// rule: the checkpoint's arguments override the command line's); the objective's flags still decide the attention.
// Without a checkpoint there (a fresh --save D --load D run) the flags' shape stands.
void adopt_checkpoint_shape(TrainArgs& args) {
  if (!std::filesystem::exists(args.load) || !has_checkpoint(args.load)) return;
  const ckpt::CheckpointReader reader(args.load);
  const ckpt::AttentionMask mask = args.model.attention_mask;
  args.model = reader.metadata().config;
  args.model.attention_mask = mask;
  args.model_config_file.clear();
  args.vocab_size_given = true;
  log::info("--use-checkpoint-args: the model's shape from {}/metadata.json", reader.dir());
}

// What the sample sources and the model point into.
struct ModelOwner {
  std::shared_ptr<void> model;  // make_training_model's backend and model
  std::shared_ptr<Splits> splits;
};

}  // namespace

TrainingSetup prepare_training(TrainArgs& args, train::ProcessGroups* groups, train::DeviceGroups* device_groups) {
  TrainingSetup setup;
  if (!args.tokenizer.type.empty()) setup.tokenizer = data::make_tokenizer(args.tokenizer);
  // --non-persistent-ckpt-type global: --load reads the newer of its own checkpoint and the non-persistent one (the
  // non-persistent one on a tie), as Megatron's _load_base_checkpoint chooses.
  if (!args.load.empty() && args.non_persistent) {
    const std::string np = args.non_persistent_dir.empty() ? train::CheckpointSaver::default_non_persistent_dir(args.load)
                                                           : args.non_persistent_dir;
    if (train::newest_checkpoint_root(args.load, np) == np) {
      log::info("--load {}: the non-persistent checkpoint in {} is the newest; resuming from it", args.load, np);
      args.load = np;
    }
  }
  if (args.use_checkpoint_args) adopt_checkpoint_shape(args);
  resolve_model_config(args, setup);
  auto& t = args.trainer;
  if (t.eod_mask_loss) {
    if (!setup.tokenizer) fail("--eod-mask-loss needs --tokenizer-type (the eod id)");
    t.eod_token = setup.tokenizer->eod();
  }
  // --device before any data is read: a missing GPU is a one-line error.
  const train::Device device = train::resolve_device(args.device);
  if (args.bf16 && device == train::Device::kCpu)
    log::warning("--bf16: the CPU backend trains in fp32; the flag applies to the GPU backend");
  if (args.cuda.fp8.enabled && device == train::Device::kCpu)
    fail("--fp8-format: the CPU backend has no FP8 training (train FP8 with --device cuda)");
  if (args.cuda.profile && device == train::Device::kCpu)
    log::warning("--cuda-profile: the CPU backend has no phase timer; the flag applies to the GPU backend");
  if (!args.save.empty()) {
    // A save folder that cannot be made is found now, not after hours of training; nothing is created
    // before the first checkpoint (a run that fails earlier leaves no folder behind).
    std::error_code ec;
    std::filesystem::path existing = std::filesystem::absolute(args.save, ec);
    while (!ec && !std::filesystem::exists(existing, ec) && existing.has_relative_path()) existing = existing.parent_path();
    if (ec || !std::filesystem::is_directory(existing) || ::access(existing.c_str(), W_OK | X_OK) != 0)
      fail(fmt::format("--save {}: cannot write a checkpoint folder there{}", args.save,
                       ec ? ": " + ec.message() : " (" + existing.string() + " is not a writable folder)"));
  }
  auto owner = std::make_shared<ModelOwner>();
  open_data(args, setup, owner->splits);

  // Megatron's rule, on which `--save D --load D` scripts rely: a --load folder without a checkpoint (no tracker)
  // is a fresh run, and so is a --load that does not exist yet when it is also --save (the first run of such a
  // script); a --load elsewhere that does not exist stays an error (a typo).
  if (!args.load.empty()) {
    const bool missing = !std::filesystem::exists(args.load);
    if (missing && (args.save.empty() || std::filesystem::weakly_canonical(args.load) !=
                                             std::filesystem::weakly_canonical(args.save)))
      fail(fmt::format("--load {}: no such folder", args.load));
    if (missing || !has_checkpoint(args.load)) {
      log::warning("--load {}: no checkpoint there (no latest); starting from scratch", args.load);
      args.load.clear();
      args.finetune = args.no_load_optim = false;
    }
  }
  if (!args.load.empty()) {
    const ckpt::CheckpointReader reader(args.load);
    ckpt::ModelConfig stored = reader.metadata().config;
    const ckpt::TrainingState& state = reader.metadata().state;
    // A checkpoint that no run has trained yet (dlm-ckpt convert --from hf writes iteration 0 and no
    // optimizer steps), or any checkpoint under --finetune (its weights only: iteration 0, fresh moments), may
    // start a run with the other attention mask: an autoregressive model becomes a masked-diffusion one as Dream
    // and DiffuLLaMA were made. A run in progress keeps its mask.
    const bool new_run = args.finetune || (state.iteration == 0 && state.optimizer_steps == 0);
    if (stored.attention_mask != setup.config.attention_mask && new_run) {
      auto name = [](ckpt::AttentionMask a) { return a == ckpt::AttentionMask::kCausal ? "causal" : "bidirectional (no_mask)"; };
      log::info("--load {}: the checkpoint's attention is {}, this run trains it {} (--attention-mask-type): a new run from its weights",
                reader.dir(), name(stored.attention_mask), name(setup.config.attention_mask));
      stored.attention_mask = setup.config.attention_mask;
    }
    // The epsilon a checkpoint was trained with is part of its model: without --norm-epsilon (or --model-config)
    // the run keeps it, so that checkpoints of dlm's former default (1e-6) resume as they were trained.
    if (!args.norm_epsilon_given && args.model_config_file.empty() && stored.norm_epsilon != setup.config.norm_epsilon) {
      log::info("--load {}: the checkpoint's RMSNorm epsilon {} (no --norm-epsilon given)", reader.dir(), stored.norm_epsilon);
      setup.config.norm_epsilon = args.model.norm_epsilon = stored.norm_epsilon;
    }
    train::check_config_matches(setup.config, stored, reader.dir() + "/metadata.json");
  }
  train::TrainingModelOptions m;
  m.device = device;
  m.seed = args.seed;
  m.threads = args.threads;
  m.init_weights = args.load.empty();
  m.groups = groups;
  m.device_groups = device_groups;
  m.sequence_parallel = args.sequence_parallel;
  m.layers_per_virtual_stage = args.layers_per_virtual_stage;
  m.distributed_optimizer = t.use_distributed_optimizer;
  m.overlap_grad_reduce = t.overlap_grad_reduce;
  m.ddp_bucket_size = t.ddp_bucket_size;
  m.recompute_layers = args.recompute_full;
  m.cuda = args.cuda;
  train::TrainingModel made = train::make_training_model(setup.config, m);
  setup.model = std::move(made.model);
  setup.placement = std::move(made.placement);
  owner->model = std::move(made.keep_alive);
  if (!args.load.empty()) {
    const auto params = setup.model->parameters();
    train::TrainCheckpoint checkpoint = setup.placement
                                            ? train::load_train_checkpoint(args.load, params, t.adam, *setup.placement)
                                            : train::load_train_checkpoint(args.load, params, t.adam);
    train::restore_weights(checkpoint, params);
    if (auto* on_device = setup.model->device_training()) on_device->commit_parameters();
    if (args.finetune) {
      log::info("--finetune: weights of {}; iteration 0, fresh AdamW moments", checkpoint.dir);
    } else {
      setup.resume = ResumeState{checkpoint.progress, std::nullopt};
      if (!args.no_load_optim) setup.resume->optimizer = std::move(checkpoint.optimizer);
      log::info("resuming {} at iteration {}{}", checkpoint.dir, setup.resume->progress.iteration,
                args.no_load_optim ? " (--no-load-optim: fresh AdamW moments)" : "");
    }
  }
  std::int64_t parameters = 0;
  for (const auto& spec : ckpt::model_tensors(setup.config)) parameters += ckpt::element_count(spec.shape);
  log::info("model: {} layers, hidden {}, {} parameters, vocabulary {} (padded {}), {} attention, on the {}",
            setup.config.num_layers, setup.config.hidden_size, parameters, setup.config.vocab_size,
            setup.config.padded_vocab_size(),
            setup.config.attention_mask == ckpt::AttentionMask::kCausal ? "causal" : "bidirectional",
            device == train::Device::kCuda ? "GPU" : "CPU");
  if (args.cuda.fp8.enabled) log::info("{}", train::fp8_summary(args.cuda.fp8, setup.config));
  setup.unigram_entropy = train::unigram_entropy(*setup.train, t.seq_length, 256);
  setup.owned = owner;
  return setup;
}

ckpt::ModelConfig resolve_model(TrainArgs& args) {
  TrainingSetup setup;
  // With --vocab-size or --model-config the shape needs no tokenizer (whose files may live on the cluster only).
  if (!args.tokenizer.type.empty() && !args.vocab_size_given && args.model_config_file.empty())
    setup.tokenizer = data::make_tokenizer(args.tokenizer);
  // The mask token changes no shape: a dry run needs none.
  auto& objective = args.trainer.objective;
  const auto kind = objective.kind;
  objective.kind = train::ObjectiveKind::kAutoregressive;
  resolve_model_config(args, setup);
  objective.kind = kind;
  return setup.config;
}

std::map<std::string, std::string> checkpoint_metadata(const TrainArgs& args) {
  std::string data;
  for (const auto& p : args.data_path) data += (data.empty() ? "" : " ") + p;
  return {
      {"data_path", data},
      {"split", args.split},
      {"seq_length", std::to_string(args.trainer.seq_length)},
      {"global_batch_size", std::to_string(args.trainer.global_batch_size)},
      {"micro_batch_size", std::to_string(args.trainer.micro_batch_size)},
      {"train_iters", std::to_string(args.trainer.train_iters)},
      {"seed", std::to_string(args.seed)},
      {"objective", std::string(train::objective_kind_name(args.trainer.objective.kind))},
      {"tokenizer_type", args.tokenizer.type},
      {"tokenizer_model", args.tokenizer.model},
  };
}

}  // namespace dlm::tools
