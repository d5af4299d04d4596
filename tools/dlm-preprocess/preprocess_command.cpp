// `dlm-preprocess --input ... --output-prefix ...`: Megatron's tools/preprocess_data.py flags.
#include "preprocess_command.h"

#include <cstdio>
#include <iostream>
#include <thread>

#include <fmt/format.h>

#include "dlm/common/thread_pool.h"
#include "dlm/data/preprocess.h"
#include "flag_checks.h"
#include "tokenizer_flags.h"

namespace po = boost::program_options;

namespace dlm::tools {

po::options_description preprocess_flags(data::PreprocessOptions& o, data::TokenizerOptions& t) {
  po::options_description opts("dlm-preprocess options (Megatron's tools/preprocess_data.py flags)");
  opts.add_options()
      ("help,h", "show this help")
      ("input", po::value(&o.inputs)->multitoken()->required(),
       "JSONL input: a file (.jsonl, .json, .jsonl.zst, .zst), a glob, a folder, or - for stdin")
      ("output-prefix", po::value(&o.output_prefix)->required(), "writes {prefix}_{key}_{document|sentence}.bin/.idx")
      ("json-keys", po::value(&o.json_keys)->multitoken()->default_value({"text"}, "text"), "keys to extract")
      ("append-eod", po::bool_switch(&o.append_eod), "append the eod id to every non-empty document")
      ("workers", po::value(&o.workers)->default_value(std::max(1u, std::thread::hardware_concurrency())),
       "tokenizer threads")
      ("partitions", po::value(&o.partitions)->default_value(1), "deal lines round-robin to N partitions, "
                                                                  "then concatenate them (Megatron's order)")
      ("keep-sequential-samples", po::bool_switch(&o.keep_sequential_samples), "partitions keep input order")
      ("split-sentences", po::bool_switch(&o.split_sentences), "sentence-level outputs; values must already be "
                                                               "arrays of sentences (dlm does not run NLTK punkt)")
      ("keep-newlines", "accepted for Megatron compatibility (only affects punkt splitting)")
      ("lang", po::value<std::string>(), "accepted for Megatron compatibility (only affects punkt splitting)")
      ("log-interval", po::value(&o.log_interval)->default_value(1000), "documents between progress lines")
      ("skip-invalid", po::bool_switch(&o.skip_invalid), "skip and count bad lines instead of stopping")
      ("quiet", "no progress lines");
  add_tokenizer_flags(opts, t);
  return opts;
}

int run_preprocess(const std::vector<std::string>& args) {
  data::PreprocessOptions options;
  data::TokenizerOptions tokenizer_options;
  po::options_description opts = preprocess_flags(options, tokenizer_options);
  po::variables_map vm;
  po::store(checked(po::command_line_parser(args).options(opts).run()), vm);
  if (vm.count("help") != 0) {
    std::cout << "usage: dlm-preprocess --input IN --output-prefix OUT --tokenizer-type T [options]\n" << opts;
    return 0;
  }
  po::notify(vm);
  if (tokenizer_options.type.empty()) throw po::error("--tokenizer-type is required");
  if (options.log_interval == 0) throw po::error("--log-interval must be at least 1");
  in_range("workers", options.workers, 1, kMaxThreads);
  in_range("partitions", options.partitions, 1, data::kMaxPartitions);
  if (tokenizer_options.vocab_size) in_range("vocab-size", *tokenizer_options.vocab_size, 1, std::size_t{1} << 31);
  in_range("tiktoken-num-special-tokens", tokenizer_options.tiktoken_num_special_tokens, 0, std::size_t{1} << 20);
  for (std::size_t k = 0; k < options.json_keys.size(); ++k)
    for (std::size_t j = 0; j < k; ++j)
      if (options.json_keys[j] == options.json_keys[k])
        throw po::error(fmt::format("--json-keys: \"{}\" is given twice (each key names its own output)", options.json_keys[k]));
  options.progress = vm.count("quiet") == 0;
  auto tokenizer = data::make_tokenizer(tokenizer_options);
  data::PreprocessSummary summary = data::preprocess_jsonl(options, *tokenizer);
  std::fputs(data::format_summary(summary).c_str(), stderr);
  return 0;
}

}  // namespace dlm::tools
