// dlm-blend: Megatron's GPTDataset / BlendedDataset indices from Megatron's data flags.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <limits>
#include <new>
#include <set>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "dlm/data/blend_args.h"
#include "dlm/data/sample_reader.h"
#include "dlm/data/tokenizer.h"
#include "tokenizer_flags.h"
#include "flag_checks.h"

namespace po = boost::program_options;
using namespace dlm::data;

namespace {

constexpr const char* kUsage =
    "usage: dlm-blend build|inspect [options]\n"
    "       dlm-blend sample N [--sample-split train|valid|test] [tokenizer options] [options]\n"
    "\n"
    "  build    build (or reuse) every split's index and cache it as megatron-core does\n"
    "  inspect  build or load, then print per split: datasets, requested vs effective weights,\n"
    "           epochs, samples, cache files\n"
    "  sample   print global sample N of a split: ids, labels, loss mask, positions, and text\n";

struct Cli {
  MegatronDataArgs data;
  std::string command, sample_split = "train";
  std::size_t sample_index = 0;
  SampleOptions sample;
  TokenizerOptions tokenizer;
};

po::options_description options(Cli& c) {
  po::options_description o("options");
  auto& d = c.data;
  o.add_options()("help,h", "this help")
      ("data-path", po::value(&d.data_path)->multitoken(), "\"w1 p1 w2 p2 ...\" or \"p1 p2 ...\"")
      ("split", po::value(&d.split)->default_value(d.split), "train,valid,test weights")
      ("train-data-path", po::value(&d.train_data_path)->multitoken(), "blend of the train split")
      ("valid-data-path", po::value(&d.valid_data_path)->multitoken(), "blend of the valid split")
      ("test-data-path", po::value(&d.test_data_path)->multitoken(), "blend of the test split")
      ("seq-length", po::value(&d.seq_length)->required(), "tokens per sample")
      ("train-samples", po::value<std::int64_t>(), "training samples")
      ("train-iters", po::value<std::int64_t>(), "training iterations (x --global-batch-size)")
      ("global-batch-size", po::value(&d.global_batch_size)->required(), "samples per iteration")
      ("eval-iters", po::value(&d.eval_iters)->default_value(d.eval_iters), "iterations per evaluation")
      ("eval-interval", po::value(&d.eval_interval)->default_value(d.eval_interval), "iterations between evaluations")
      ("seed", po::value(&d.seed)->default_value(d.seed), "random seed")
      ("data-cache-path", po::value<std::string>(), "index cache folder (default: PREFIX/cache/GPTDataset_indices)")
      ("no-add-extra-token-to-sequence", "samples of seq-length tokens (labels padded), not seq-length + 1")
      ("tokenizer-identifiers", po::value(&d.tokenizer_identifiers), "the tokenizer's unique identifiers as JSON "
                                                                       "(from a Megatron description file)")
      ("sample-split", po::value(&c.sample_split)->default_value(c.sample_split), "split for `sample`")
      ("eod", po::value(&c.sample.eod), "eod id (default: the tokenizer's)")
      ("reset-position-ids", po::bool_switch(&c.sample.reset_position_ids), "positions restart after eod")
      ("reset-attention-mask", po::bool_switch(&c.sample.reset_attention_mask), "attention within documents")
      ("eod-mask-loss", po::bool_switch(&c.sample.eod_mask_loss), "no loss on eod tokens");
  dlm::tools::add_tokenizer_flags(o, c.tokenizer);  // `sample` detokenizes with it
  return o;
}

// The cache folders a build writes into (megatron-core's default is beside each dataset): temporaries a
// killed run left there are removed before this run writes.
void remove_stale_cache_temporaries(const BuilderConfig& config) {
  std::set<std::string> folders;
  if (config.gpt.cache_path) folders.insert(*config.gpt.cache_path);
  auto add = [&](const std::optional<Blend>& blend) {
    if (blend && !config.gpt.cache_path)
      for (const auto& prefix : blend->prefixes) folders.insert(prefix + "/cache/GPTDataset_indices");
  };
  add(config.blend);
  for (const auto& b : config.blend_per_split) add(b);
  for (const auto& folder : folders) dlm::remove_stale_temporaries(folder);
}

// Megatron asserts these (or divides by them); a value outside is a usage error naming the flag.
void check_ranges(const Cli& c, const po::variables_map& vm) {
  using dlm::tools::in_range;
  constexpr std::int64_t kBig = std::int64_t{1} << 40;
  in_range("seq-length", c.data.seq_length, 1, 1 << 24);
  in_range("global-batch-size", c.data.global_batch_size, 1, 1 << 30);
  if (c.data.train_samples) in_range("train-samples", *c.data.train_samples, 1, kBig);
  if (c.data.train_iters) in_range("train-iters", *c.data.train_iters, 1, kBig);
  in_range("eval-iters", c.data.eval_iters, 0, kBig);
  in_range("eval-interval", c.data.eval_interval, 1, kBig);
  if (vm.count("eod")) in_range("eod", c.sample.eod, 0, std::numeric_limits<std::int32_t>::max());
  if (c.tokenizer.vocab_size) in_range("vocab-size", *c.tokenizer.vocab_size, 1, std::size_t{1} << 31);
}

int run(Cli& c) {
  const auto t0 = std::chrono::steady_clock::now();
  const BuilderConfig config = builder_config(c.data);
  if (c.command != "sample") remove_stale_cache_temporaries(config);
  const auto splits = build_datasets(config);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (c.command == "build") {
    for (const auto& s : splits)
      if (s) fmt::print("{}: {} samples\n", split_name(s->split), s->size());
    fmt::print(stderr, "built in {:.3f} s\n", seconds);
    return 0;
  }
  if (c.command == "inspect") {
    fmt::print("{}", inspect_report(splits));
    return 0;
  }
  std::size_t which = 0;
  while (which < 3 && c.sample_split != split_name(static_cast<Split>(which))) ++which;
  if (which == 3) throw dlm::Error("--sample-split must be train, valid or test, not '" + c.sample_split + "'");
  if (!splits[which]) throw dlm::Error(std::string("the ") + c.sample_split + " split is empty");
  std::unique_ptr<Tokenizer> tokenizer;
  if (!c.tokenizer.type.empty()) tokenizer = make_tokenizer(c.tokenizer);
  if (tokenizer && c.sample.eod < 0) c.sample.eod = tokenizer->eod();
  SampleReader reader(*splits[which], c.sample);
  const Sample s = reader.read(c.sample_index);
  auto join = [](const auto& v) { return fmt::format("{}", fmt::join(v, " ")); };
  fmt::print("sample {} of {} ({} samples): dataset {} ({}), sample {}\n", c.sample_index, c.sample_split, reader.size(),
             s.dataset, splits[which]->datasets[s.dataset]->prefix(), s.dataset_sample);
  fmt::print("tokens: {}\nlabels: {}\nloss_mask: {}\nposition_ids: {}\n", join(s.tokens), join(s.labels),
             join(s.loss_mask), join(s.position_ids));
  if (c.sample.reset_attention_mask) fmt::print("segment_ids: {}\n", join(s.segment_ids));
  if (tokenizer) fmt::print("text: {}\n", tokenizer->decode(s.tokens));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    if (!args.empty()) {
      Cli c;
      std::cout << options(c);
    }
    return args.empty() ? 2 : 0;
  }
  Cli c;
  c.command = args[0];
  args.erase(args.begin());
  try {
    if (c.command != "build" && c.command != "inspect" && c.command != "sample")
      throw po::error("unknown command '" + c.command + "'");
    if (c.command == "sample") {
      if (args.empty()) throw po::error("sample: expected the sample number N");
      try {
        c.sample_index = std::stoull(args[0]);
      } catch (const std::exception&) {
        throw po::error("sample: N must be a number, not '" + args[0] + "'");
      }
      args.erase(args.begin());
    }
    po::variables_map vm;
    po::store(dlm::tools::checked(po::command_line_parser(args).options(options(c)).run()), vm);
    if (vm.count("help")) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    po::notify(vm);
    if (vm.count("train-samples")) c.data.train_samples = vm["train-samples"].as<std::int64_t>();
    if (vm.count("train-iters")) c.data.train_iters = vm["train-iters"].as<std::int64_t>();
    if (vm.count("data-cache-path")) c.data.data_cache_path = vm["data-cache-path"].as<std::string>();
    c.data.add_extra_token_to_sequence = !vm.count("no-add-extra-token-to-sequence");
    check_ranges(c, vm);
  } catch (const po::error& e) {
    fmt::print(stderr, "dlm-blend: {}\n(see dlm-blend --help)\n", e.what());
    return 2;
  }
  try {
    return run(c);
  } catch (const std::bad_alloc&) {
    // Cache files are written under temporary names; none was renamed into place.
    fmt::print(stderr, "dlm-blend: out of memory while {}; no cache file left incomplete\n",
               c.command == "sample" ? "reading the sample" : "building the indices");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dlm-blend: {}\n", e.what());
    return 1;
  }
}
