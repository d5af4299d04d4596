#include "megatron_flags.h"

#include <cctype>
#include <cstdlib>
#include <map>
#include <span>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace po = boost::program_options;

namespace dlm::tools {
namespace {

bool number_is(const std::string& v, double want) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  return !v.empty() && end == v.c_str() + v.size() && d == want;
}
bool is_zero(const std::string& v) { return number_is(v, 0.0); }
bool is_one(const std::string& v) { return number_is(v, 1.0); }

// A flag that states what dlm already does. `value`: nullptr for a switch, else the values dlm accepts (shown by
// --help); `accepts` decides; `dlm` says what dlm does (the error for any other value, and the help text).
struct AsIs {
  const char* flag;
  const char* value;
  bool (*accepts)(const std::string&);
  const char* dlm;
};

const AsIs kAsIs[] = {
    {"swiglu", nullptr, nullptr, "dlm's MLP is SwiGLU"},
    {"normalization", "RMSNorm", [](const std::string& v) { return v == "RMSNorm"; }, "dlm's norms are RMSNorm"},
    {"position-embedding-type", "rope", [](const std::string& v) { return v == "rope"; },
     "dlm's positions are rotary (RoPE, --rotary-base)"},
    {"disable-bias-linear", nullptr, nullptr, "dlm's linear layers have no biases"},
    {"attention-dropout", "0", is_zero, "dlm trains without dropout"},
    {"hidden-dropout", "0", is_zero, "dlm trains without dropout"},
    {"rotary-percent", "1.0", is_one, "dlm rotates the whole head dimension"},
    {"attention-softmax-in-fp32", nullptr, nullptr, "dlm's attention computes its softmax in fp32"},
    {"attention-backend", "flash|fused|auto",
     [](const std::string& v) { return v == "flash" || v == "fused" || v == "auto"; },
     "dlm's GPU attention is fused flash attention (cuDNN, or dlm's own: --cuda-attention)"},
    {"no-bias-gelu-fusion", nullptr, nullptr, "dlm's MLP has neither bias nor GELU"},
    {"no-bias-dropout-fusion", nullptr, nullptr, "dlm has neither biases nor dropout to fuse"},
    {"no-bias-swiglu-fusion", nullptr, nullptr, "dlm's MLP has no bias to fuse into its SwiGLU"},
    {"no-masked-softmax-fusion", nullptr, nullptr, "dlm's attention applies its mask inside the fused kernel"},
    {"cross-entropy-loss-fusion", nullptr, nullptr, "dlm's cross entropy is one fused kernel"},
    {"use-mcore-models", nullptr, nullptr, "dlm has one model implementation"},
    {"use-flash-attn", nullptr, nullptr, "dlm's GPU attention is fused flash attention"},
    {"context-parallel-size", "1", is_one, "dlm has no context parallelism (--sequence-parallel with TP splits activations)"},
    {"num-distributed-optimizer-instances", "1", is_one,
     "dlm's distributed optimizer shards over the whole data-parallel group (one instance)"},
    {"rerun-mode", "disabled|validate_results",
     [](const std::string& v) { return v == "disabled" || v == "validate_results"; },
     "dlm checks every step's loss and gradient norm for NaN/Inf and stops after saving the last good state "
     "(--on-nan); it does not re-run a step to tell a transient fault from a persistent one"},
    {"base-model", "vanilla", [](const std::string& v) { return v == "vanilla"; },
     "MegaDLMs' vanilla model is dlm's (Qwen_2 is not)"},
    {"no-load-rng", nullptr, nullptr, "dlm keeps no RNG state: the noise is keyed by --seed and the sample index"},
    {"no-save-rng", nullptr, nullptr, "dlm keeps no RNG state: the noise is keyed by --seed and the sample index"},
    {"ckpt-fully-parallel-load", nullptr, nullptr, "each rank reads only its own shards of a dlm checkpoint"},
    {"ckpt-fully-parallel-save", nullptr, nullptr, "each position's shards are written by one rank of a dlm checkpoint"},
    {"auto-detect-ckpt-format", nullptr, nullptr,
     "--load reads dlm's format; a folder holding only a Megatron checkpoint is refused, naming it"},
    {"exit-signal-handler", nullptr, nullptr,
     "dlm-train always handles SIGTERM/SIGINT: it finishes the step, saves (with --save) and exits 0"},
    {"no-create-attention-mask-in-dataloader", nullptr, nullptr, "dlm's data loader makes no attention mask"},
    {"empty-unused-memory-level", "0|1|2", [](const std::string& v) { return v == "0" || v == "1" || v == "2"; },
     "dlm allocates its GPU memory once: there is no cache to empty"},
    {"manual-gc", nullptr, nullptr, "dlm has no garbage collector"},
    {"num-workers", "N", [](const std::string& v) { return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos; },
     "dlm reads samples in the training process"},
    {"no-mmap-bin-files", nullptr, nullptr, "dlm maps .bin files (read-only); the result is the same"},
};

// A flag and a line about it: why it changes nothing, or what dlm offers instead. `value`: what --help shows for
// its value (nullptr: a switch).
struct FlagNote {
  const char* flag;
  const char* text;
  const char* value = nullptr;
};

// Accepted, and changes nothing in dlm today: each is named in one start-up line.
const FlagNote kNoEffect[] = {
    {"distributed-backend", "dlm's groups are MPI/NCCL (or staged), chosen by the backend", "NAME"},
    {"wandb-tags", "not passed to W&B", "TAG"},
    {"wandb-notes", "not passed to W&B", "TEXT"},
    {"wandb-resume", "`wandb sync --id` adds to the run of that id", "MODE"},
};

// Refused: dlm does not do what the flag asks; the line says what it offers instead.
const FlagNote kRefused[] = {
    {"fp16", "dlm trains in bf16 (--bf16) or fp32"},
    {"fp8-param-gather", "dlm keeps bf16 weights and casts them to FP8 per step (--fp8-format); no FP8 all-gather"},
    {"add-qkv-bias", "dlm's attention has no biases (Megatron's --disable-bias-linear model)"},
    {"add-bias-linear", "dlm's linear layers have no biases"},
    {"apply-layernorm-1p", "dlm's RMSNorm multiplies by its weight (no 1 + weight)"},
    {"apply-query-key-layer-scaling", "dlm scales attention scores by 1/sqrt(head dim) only"},
    {"squared-relu", "dlm's MLP is SwiGLU (--swiglu)"},
    {"no-save-optim", "dlm's checkpoints keep the AdamW moments; `dlm-ckpt convert --to hf` writes weights only"},
    {"step-batch-size-schedule", "dlm trains with a fixed --global-batch-size", "SCHEDULE"},
    {"rampup-batch-size", "dlm trains with a fixed --global-batch-size", "START INCREMENT SAMPLES"},
    {"decoupled-lr", "one learning rate for every parameter (--lr, --min-lr)", "LR"},
    {"decoupled-min-lr", "one learning rate for every parameter (--lr, --min-lr)", "LR"},
    {"calculate-per-token-loss", "dlm averages the loss over each micro-batch as Megatron does without the flag"},
    {"grad-reduce-in-bf16", "dlm reduces gradients in fp32"},
    {"accumulate-allreduce-grads-in-fp32", "dlm accumulates and reduces gradients in fp32 always; drop the flag"},
    {"use-precision-aware-optimizer", "dlm keeps fp32 master weights and moments always; drop the flag"},
    {"profile", "use --cuda-profile (the step's phases) or nsys"},
    {"profile-step-start", "use --cuda-profile (the step's phases) or nsys", "N"},
    {"profile-step-end", "use --cuda-profile (the step's phases) or nsys", "N"},
    {"use-dist-ckpt", "dlm writes its own checkpoint format (--ckpt-format is accepted and says where)"},
    {"tp-comm-overlap", "dlm overlaps no tensor-parallel communication with GEMMs"},
};

using Values = std::vector<std::string>;

// A switch takes no words; a flag with a value takes any number (so that a refused one is named with what followed
// it), shown in --help by `value_name`.
po::typed_value<Values>* words(const char* value_name) {
  if (!value_name) return po::value<Values>()->zero_tokens();
  return po::value<Values>()->multitoken()->zero_tokens()->value_name(value_name);
}

std::string given(const std::string& flag, const Values& v) {
  std::string s = "--" + flag;
  for (const auto& x : v) s += " " + x;
  return s;
}

}  // namespace

void add_megatron_surface(po::options_description& as_is, po::options_description& no_effect,
                          po::options_description& refused) {
  for (const AsIs& f : kAsIs) as_is.add_options()(f.flag, words(f.value), f.dlm);
  for (const FlagNote& f : kNoEffect) no_effect.add_options()(f.flag, words(f.value), f.text);
  for (const FlagNote& f : kRefused) refused.add_options()(f.flag, words(f.value), f.text);
}

void check_megatron_surface(const po::variables_map& vm) {
  for (const FlagNote& f : kRefused)
    if (vm.count(f.flag)) fail(fmt::format("{}: not supported: {}", given(f.flag, vm[f.flag].as<Values>()), f.text));
  for (const AsIs& f : kAsIs) {
    if (!vm.count(f.flag)) continue;
    const auto& v = vm[f.flag].as<Values>();
    if (f.value && (v.size() != 1 || !f.accepts(v[0])))
      fail(fmt::format("{}: not supported: {} (accepted: {})", given(f.flag, v), f.dlm, f.value));
  }
}

std::string no_effect_notice(const po::variables_map& vm) {
  std::string names;
  for (const FlagNote& f : kNoEffect)
    if (vm.count(f.flag)) names += (names.empty() ? "--" : ", --") + std::string(f.flag);
  return names.empty() ? "" : "accepted, no effect in dlm (see --help): " + names;
}

std::vector<std::string> last_occurrence_wins(int argc, char** argv) {
  const auto starts_option = [](const std::string& t) {
    if (t.size() < 2 || t[0] != '-') return false;
    return !(std::isdigit(static_cast<unsigned char>(t[1])) || t[1] == '.');  // -1, -0.5: values
  };
  // Each option with its values; the key is the name before any '='.
  std::vector<std::pair<std::string, Values>> groups;
  for (int i = 1; i < argc; ++i) {
    const std::string t = argv[i];
    if (starts_option(t) || groups.empty())
      groups.push_back({t.substr(0, t.find('=')), {t}});
    else
      groups.back().second.push_back(t);
  }
  std::map<std::string, std::size_t> last;
  for (std::size_t g = 0; g < groups.size(); ++g) last[groups[g].first] = g;
  std::vector<std::string> out = {argv[0]};
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (last[groups[g].first] == g) out.insert(out.end(), groups[g].second.begin(), groups[g].second.end());
  return out;
}

}  // namespace dlm::tools
