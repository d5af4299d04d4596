// dlm-preprocess: JSONL -> Megatron .bin/.idx (Megatron's tools/preprocess_data.py flags), and the dataset
// chores around it: validate, merge (tools/merge_datasets.py), inspect.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "dlm/data/indexed_dataset.h"
#include "dlm/data/preprocess_inspect.h"
#include "flag_checks.h"
#include "preprocess_command.h"
#include "tokenizer_flags.h"

namespace po = boost::program_options;

namespace {

constexpr const char* kUsage =
    "usage: dlm-preprocess --input IN --output-prefix OUT --tokenizer-type T [options]   (--help for all)\n"
    "       dlm-preprocess validate PREFIX...\n"
    "       dlm-preprocess merge --input PREFIX... --output-prefix OUT\n"
    "       dlm-preprocess inspect PREFIX [--documents N] [--top N] [--tokenizer-* ...]\n"
    "\n"
    "  (default)  tokenize JSONL into {OUT}_{key}_document.bin/.idx, byte-identical to Megatron's\n"
    "  validate   check .bin/.idx pairs (header, counts, pointers, document indices)\n"
    "  merge      concatenate datasets in order (Megatron's tools/merge_datasets.py)\n"
    "  inspect    counts, document lengths, most frequent ids; first documents detokenized\n";

int run_validate(const std::vector<std::string>& prefixes) {
  if (prefixes.empty()) throw po::error("validate: expected at least one PREFIX");
  for (const auto& prefix : prefixes) {
    dlm::data::IndexedDataset ds(prefix);
    ds.validate();
    fmt::print("{}: ok: {} sequences, {} documents, dtype {}\n", prefix, ds.num_sequences(), ds.num_documents(),
               dlm::data::dtype_name(ds.dtype()));
  }
  return 0;
}

int run_merge(const std::vector<std::string>& args) {
  po::options_description opts("merge options");
  std::vector<std::string> inputs;
  std::string output;
  opts.add_options()("help,h", "this help")("input", po::value(&inputs)->multitoken()->required(), "prefixes to merge, in order")(
      "output-prefix", po::value(&output)->required(), "prefix of the merged dataset");
  po::variables_map vm;
  po::store(dlm::tools::checked(po::command_line_parser(args).options(opts).run()), vm);
  if (vm.count("help")) return std::cout << opts, 0;
  po::notify(vm);
  const auto folder = std::filesystem::path(output).parent_path();
  dlm::remove_stale_temporaries(folder.empty() ? std::string(".") : folder.string());  // a killed merge's
  dlm::data::IndexedDataset first(inputs.front());
  dlm::data::IndexedDatasetWriter writer(output, first.dtype());
  for (const auto& prefix : inputs) writer.append(prefix);
  writer.finalize();
  fmt::print(stderr, "merged {} datasets: {} documents, {} sequences -> {}\n", inputs.size(), writer.num_documents(),
             writer.num_sequences(), output);
  return 0;
}

int run_inspect(const std::vector<std::string>& args) {
  po::options_description opts("inspect options");
  std::string prefix;
  std::size_t documents = 3, top = 10;
  dlm::data::TokenizerOptions tokenizer_options;
  opts.add_options()("help,h", "this help")("prefix", po::value(&prefix)->required(), "dataset prefix (PREFIX.bin, PREFIX.idx)")(
      "documents", po::value(&documents)->default_value(3), "documents to print detokenized (needs --tokenizer-*)")(
      "top", po::value(&top)->default_value(10), "most frequent ids to list");
  dlm::tools::add_tokenizer_flags(opts, tokenizer_options);
  po::positional_options_description positional;
  positional.add("prefix", 1);
  po::variables_map vm;
  po::store(dlm::tools::checked(po::command_line_parser(args).options(opts).positional(positional).run()), vm);
  if (vm.count("help")) return std::cout << opts, 0;
  po::notify(vm);
  dlm::tools::in_range("documents", documents, 0, 1000000);
  dlm::tools::in_range("top", top, 0, 1000000);
  if (tokenizer_options.vocab_size) dlm::tools::in_range("vocab-size", *tokenizer_options.vocab_size, 1, std::size_t{1} << 31);
  dlm::data::IndexedDataset ds(prefix);
  std::unique_ptr<dlm::data::Tokenizer> tokenizer;
  if (!tokenizer_options.type.empty()) tokenizer = dlm::data::make_tokenizer(tokenizer_options);
  auto stats = dlm::data::inspect_dataset(ds, top);
  std::fputs(dlm::data::format_stats(ds, stats, tokenizer.get(), documents).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  try {
    const std::string& command = args[0];
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (command == "validate") return run_validate(rest);
    if (command == "merge") return run_merge(rest);
    if (command == "inspect") return run_inspect(rest);
    if (command.rfind("--", 0) == 0) return dlm::tools::run_preprocess(args);
    fmt::print(stderr, "dlm-preprocess: unknown command '{}'\n{}", command, kUsage);
    return 2;
  } catch (const po::error& e) {
    fmt::print(stderr, "dlm-preprocess: {}\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    // Outputs are still temporaries, removed as the exception unwound.
    const char* what = args[0] == "validate" ? "validating"
                       : args[0] == "merge"  ? "merging"
                       : args[0] == "inspect" ? "inspecting"
                                              : "preprocessing";
    fmt::print(stderr, "dlm-preprocess: out of memory while {}; no output written\n", what);
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dlm-preprocess: {}\n", e.what());
    return 1;
  }
}
