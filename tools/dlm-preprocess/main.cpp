// dlm-preprocess: JSONL -> Megatron .bin/.idx, and the dataset chores around it (validate, merge).
#include <cstdio>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/data/indexed_dataset.h"

namespace po = boost::program_options;

namespace {

constexpr const char* kUsage =
    "usage: dlm-preprocess validate PREFIX...\n"
    "       dlm-preprocess merge --input PREFIX... --output-prefix OUT\n"
    "\n"
    "  validate  check .bin/.idx pairs (header, counts, pointers, document indices)\n"
    "  merge     concatenate datasets in order (Megatron's tools/merge_datasets.py)\n";

int run_validate(const std::vector<std::string>& prefixes) {
  if (prefixes.empty()) throw dlm::Error("validate: expected at least one PREFIX");
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
  opts.add_options()("input", po::value(&inputs)->multitoken()->required(), "prefixes to merge, in order")(
      "output-prefix", po::value(&output)->required(), "prefix of the merged dataset");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(opts).run(), vm);
  po::notify(vm);
  dlm::data::IndexedDataset first(inputs.front());
  dlm::data::IndexedDatasetWriter writer(output, first.dtype());
  for (const auto& prefix : inputs) writer.append(prefix);
  writer.finalize();
  fmt::print(stderr, "merged {} datasets: {} documents, {} sequences -> {}\n", inputs.size(), writer.num_documents(),
             writer.num_sequences(), output);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  try {
    std::string command = args[0];
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (command == "validate") return run_validate(rest);
    if (command == "merge") return run_merge(rest);
    fmt::print(stderr, "dlm-preprocess: unknown command '{}'\n{}", command, kUsage);
    return 2;
  } catch (const po::error& e) {
    fmt::print(stderr, "dlm-preprocess: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dlm-preprocess: {}\n", e.what());
    return 1;
  }
}
