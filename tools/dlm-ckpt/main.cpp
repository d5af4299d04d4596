// dlm-ckpt: convert, validate and inspect checkpoints (native dlm, Hugging Face, Megatron).
//   dlm-ckpt convert --from native|hf|megatron --to native|hf [--tp N] [--pp N] [--dtype bf16|fp32] [--num-shards N] IN OUT
//   dlm-ckpt convert --from native|hf|megatron --to megatron [--target-tensor-parallel-size N] [--target-pipeline-parallel-size N] IN OUT
//   dlm-ckpt validate DIR [--against DIR2 --rtol R --atol A]
//   dlm-ckpt inspect DIR
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include "dlm/ckpt/tools.h"
#include "dlm/common/error.h"
#include "flag_checks.h"

namespace po = boost::program_options;
using namespace dlm::ckpt;

namespace {

constexpr const char* kUsage = R"(usage:
  dlm-ckpt convert --from native|hf|megatron --to native|hf [--tp N] [--pp N] [--layers-per-stage A,B,..]
                   [--dtype bf16|fp32|fp16] [--num-shards N | --max-shard-size 5GB] [--tokenizer DIR]
                   [--make-vocab-size-divisible-by N] IN OUT
  dlm-ckpt convert --from native|hf|megatron --to megatron [--target-tensor-parallel-size N]
                   [--target-pipeline-parallel-size N] IN OUT    (Megatron torch_dist, any TP/PP loads it)
  dlm-ckpt validate DIR [--against DIR2 [--rtol R] [--atol A]]
  dlm-ckpt inspect DIR
IN/OUT of a native checkpoint: its root (with `latest`) or an iter_XXXXXXX folder; OUT is a root.
IN of a Megatron checkpoint (legacy or torch_dist): its root (latest_checkpointed_iteration.txt) or an iter_XXXXXXX folder.
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

CheckpointKind kind_of(const std::string& s, const char* flag) {
  if (s == "native") return CheckpointKind::kNative;
  if (s == "hf") return CheckpointKind::kHuggingFace;
  if (s == "megatron") return CheckpointKind::kMegatron;
  throw UsageError(fmt::format("{} must be native, hf or megatron, got '{}'", flag, s));
}

// OUT inside IN, IN inside OUT, or the same folder: the conversion would write into what it reads.
void refuse_overlap(const std::string& in, const std::string& out) {
  std::error_code ec;
  const auto a = std::filesystem::weakly_canonical(in, ec), b = std::filesystem::weakly_canonical(out, ec);
  if (ec) return;  // the conversion names the path that cannot be resolved
  auto within = [](const std::filesystem::path& inner, const std::filesystem::path& outer) {
    const auto rel = inner.lexically_relative(outer);
    return !rel.empty() && *rel.begin() != "..";
  };
  if (within(a, b) || within(b, a))
    throw UsageError(fmt::format("convert: OUT {} overlaps IN {}; expected a folder outside it", out, in));
}

int print_report(const Report& r) {
  for (const std::string& l : r.lines) fmt::print("{}\n", l);
  for (const std::string& e : r.errors) fmt::print("ERROR: {}\n", e);
  fmt::print("{}\n", r.ok() ? "OK" : fmt::format("FAILED: {} problem(s)", r.errors.size()));
  return r.ok() ? 0 : 1;
}

int run(int argc, char** argv) {
  po::options_description opts("options");
  opts.add_options()("help,h", "this help")("from", po::value<std::string>(), "input kind: native | hf | megatron")(
      "to", po::value<std::string>(), "output kind: native | hf | megatron")("tp", po::value<int>()->default_value(1), "tensor-parallel size")(
      "pp", po::value<int>()->default_value(1), "pipeline-parallel size")(
      "layers-per-stage", po::value<std::string>(), "uneven pipeline stages, e.g. 5,6,6,5")(
      "target-tensor-parallel-size", po::value<int>()->default_value(1), "Megatron output: the TP it records (vocabulary padding)")(
      "target-pipeline-parallel-size", po::value<int>()->default_value(1), "Megatron output: the PP it records")(
      "dtype", po::value<std::string>()->default_value("bf16"), "HF output dtype: bf16 | fp32 | fp16")(
      "num-shards", po::value<int>(), "HF output: at most N safetensors shards, even sizes")(
      "max-shard-size", po::value<std::string>()->default_value("5GiB"), "HF output: shard cap (5GB, 500MiB, bytes)")(
      "tokenizer", po::value<std::string>(), "folder of tokenizer files to copy (default: the input's)")(
      "make-vocab-size-divisible-by", po::value<int>()->default_value(128), "vocabulary padding of HF input")(
      "against", po::value<std::string>(), "validate: compare every tensor with this checkpoint")(
      "rtol", po::value<double>()->default_value(0.0), "relative tolerance of --against")(
      "atol", po::value<double>()->default_value(0.0), "absolute tolerance of --against")(
      "args", po::value<std::vector<std::string>>(), "command and paths");
  po::positional_options_description pos;
  pos.add("args", -1);
  po::variables_map vm;
  try {
    po::store(dlm::tools::checked(po::command_line_parser(argc, argv).options(opts).positional(pos).run()), vm);
    po::notify(vm);
    dlm::tools::in_range("tp", vm["tp"].as<int>(), 1, 1 << 16);
    dlm::tools::in_range("pp", vm["pp"].as<int>(), 1, 1 << 16);
    dlm::tools::in_range("target-tensor-parallel-size", vm["target-tensor-parallel-size"].as<int>(), 1, 1 << 16);
    dlm::tools::in_range("target-pipeline-parallel-size", vm["target-pipeline-parallel-size"].as<int>(), 1, 1 << 16);
    dlm::tools::in_range("make-vocab-size-divisible-by", vm["make-vocab-size-divisible-by"].as<int>(), 1, 1 << 16);
    dlm::tools::in_range("rtol", vm["rtol"].as<double>(), 0, 1e30);
    dlm::tools::in_range("atol", vm["atol"].as<double>(), 0, 1e30);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  if (vm.count("help") || argc < 2) {
    std::ostringstream help;
    help << opts;
    fmt::print("{}\n{}", kUsage, help.str());
    return vm.count("help") ? 0 : 2;
  }
  const auto args = vm.count("args") ? vm["args"].as<std::vector<std::string>>() : std::vector<std::string>{};
  const std::string command = args.empty() ? "" : args[0];
  if (command == "convert") {
    if (args.size() != 3) throw UsageError("convert takes IN and OUT");
    if (!vm.count("from") || !vm.count("to")) throw UsageError("convert needs --from and --to");
    ConvertOptions o;
    o.from = kind_of(vm["from"].as<std::string>(), "--from");
    o.to = kind_of(vm["to"].as<std::string>(), "--to");
    o.layout.tp = vm["tp"].as<int>();
    o.layout.pp = vm["pp"].as<int>();
    if (o.to != CheckpointKind::kMegatron && (!vm["target-tensor-parallel-size"].defaulted() || !vm["target-pipeline-parallel-size"].defaulted()))
      throw UsageError("--target-tensor-parallel-size and --target-pipeline-parallel-size are for --to megatron (use --tp/--pp for native output)");
    o.megatron = {.tp = vm["target-tensor-parallel-size"].as<int>(), .pp = vm["target-pipeline-parallel-size"].as<int>()};
    if (vm.count("layers-per-stage")) {
      std::string s = vm["layers-per-stage"].as<std::string>();
      for (std::size_t at = 0; at <= s.size();) {
        const std::size_t comma = std::min(s.find(',', at), s.size());
        try {
          o.layout.layers_per_stage.push_back(std::stoi(s.substr(at, comma - at)));
        } catch (const std::exception&) {
          throw UsageError(fmt::format("--layers-per-stage: '{}' is not a list of integers", s));
        }
        at = comma + 1;
      }
    }
    if (!parse_dtype(vm["dtype"].as<std::string>(), o.dtype)) throw UsageError("--dtype must be fp32, bf16 or fp16");
    if (!parse_byte_size(vm["max-shard-size"].as<std::string>(), o.max_shard_bytes))
      throw UsageError(fmt::format("--max-shard-size: '{}' is not a size (5GB, 500MiB, 1000000)", vm["max-shard-size"].as<std::string>()));
    if (vm.count("num-shards") && (o.num_shards = vm["num-shards"].as<int>()) <= 0) throw UsageError("--num-shards must be positive");
    if (vm.count("tokenizer")) o.tokenizer_dir = vm["tokenizer"].as<std::string>();
    o.make_vocab_size_divisible_by = vm["make-vocab-size-divisible-by"].as<int>();
    refuse_overlap(args[1], args[2]);
    const std::string out = convert_checkpoint(args[1], args[2], o);
    fmt::print("dlm-ckpt: wrote {}\n", out);
    return 0;
  }
  if (command == "validate") {
    if (args.size() != 2) throw UsageError("validate takes DIR");
    const int structure = print_report(validate_checkpoint(args[1]));
    if (!vm.count("against")) return structure;
    const int compare = print_report(compare_checkpoints(args[1], vm["against"].as<std::string>(), vm["rtol"].as<double>(), vm["atol"].as<double>()));
    return structure || compare;
  }
  if (command == "inspect") {
    if (args.size() != 2) throw UsageError("inspect takes DIR");
    fmt::print("{}", inspect_checkpoint(args[1]));
    return 0;
  }
  throw UsageError(command.empty() ? "missing command (convert, validate, inspect)" : fmt::format("unknown command '{}'", command));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    fmt::print(stderr, "dlm-ckpt: {}\n(see dlm-ckpt --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dlm-ckpt: {}\n", dlm::user_message(e));
    return 1;
  }
}
