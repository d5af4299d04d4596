// dlm-generate: samples text from a diffusion (or AR) model checkpoint, native or Hugging Face.
#include <chrono>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include "dlm/common/error.h"
#include "cuda_flags.h"
#include "dlm/common/thread_pool.h"
#include "dlm/train/device.h"
#include "flag_checks.h"
#include "generation_model.h"
#include "tokenizer_flags.h"

namespace po = boost::program_options;
using namespace dlm;

int main(int argc, char** argv) {
  std::string checkpoint, mode, remasking = "low_confidence", device, kv_cache = "none";
  std::vector<std::string> prompts;
  data::TokenizerOptions tok;
  train::DiffusionSamplingOptions d;
  train::ArSamplingOptions ar;
  std::int32_t mask_token = -1;
  std::uint64_t seed = 0;
  double temperature = 0, top_p = 1;
  std::int64_t top_k = 0, max_new = 64, steps = 0, block = 0;
  int threads = 0;
  bool no_eos_stop = false, report_speed = false;
  po::options_description opts("dlm-generate: sample from a checkpoint (prompts from --prompt, else one per stdin line)");
  opts.add_options()
      ("load", po::value(&checkpoint)->required(), "dlm checkpoint folder or Hugging Face model folder")
      ("prompt", po::value(&prompts)->multitoken(), "prompt(s); none: read stdin, one prompt per line")
      ("mode", po::value(&mode), "diffusion | ar (default: from the checkpoint's attention mask)")
      ("max-new-tokens", po::value(&max_new)->default_value(max_new), "tokens to generate (G)")
      ("sample-steps", po::value(&steps), "diffusion steps S (default G)")
      ("inference-block-size", po::value(&block), "block length K for semi-AR decoding (default G)")
      ("remasking", po::value(&remasking)->default_value(remasking), "low_confidence | random")
      ("cfg-scale", po::value(&d.cfg_scale)->default_value(0.0), "classifier-free guidance w")
      ("threshold", po::value(&d.confidence_threshold)->default_value(0.0), "parallel decoding above this confidence")
      ("kv-cache", po::value(&kv_cache)->default_value(kv_cache), "none | prefix | dual: block KV cache (docs/generation.md)")
      ("cache-refresh", po::value(&d.cache_refresh)->default_value(0), "with --kv-cache: a full forward every N steps of a block (0: at its start only)")
      ("temperature", po::value(&temperature)->default_value(temperature), "0: greedy")
      ("top-k", po::value(&top_k)->default_value(0), "AR only; 0 disables")
      ("top-p", po::value(&top_p)->default_value(1.0), "nucleus; 1 disables")
      ("mask-token", po::value(&mask_token), "mask id (default: the config's or the tokenizer's)")
      ("no-eos-stop", po::bool_switch(&no_eos_stop), "keep tokens after the first eos")
      ("seed", po::value(&seed)->default_value(0), "sampling seed: one seed, one output")
      ("report-speed", po::bool_switch(&report_speed),
       "sample twice; print the second run's seconds, tokens/s and model forwards to stderr (the first warms up)")
      ("threads", po::value(&threads)->default_value(0), "CPU threads (0: all cores)")
      ("device", po::value(&device), "cpu | cuda (default: cuda when dlm has the CUDA backend and a GPU is present)")
      ("help,h", "this help");
  tools::add_tokenizer_flags(opts, tok, {"HuggingFaceTokenizer", true});
  train::CudaOptions cuda;
  tools::add_cuda_flags(opts, cuda, tools::CudaFlagsFor::kSampling);
  try {
    po::variables_map vm;
    po::store(tools::checked(po::command_line_parser(argc, argv).options(opts).run()), vm);
    if (vm.count("help")) {
      std::cout << opts;
      return 0;
    }
    po::notify(vm);
    // Ranges of the sampling flags: each value outside is a usage error naming the flag.
    using tools::in_range;
    in_range("max-new-tokens", max_new, 1, 1 << 20);
    if (vm.count("sample-steps")) in_range("sample-steps", steps, 1, 1 << 20);
    if (vm.count("inference-block-size")) in_range("inference-block-size", block, 1, 1 << 20);
    if (vm.count("mask-token")) in_range("mask-token", mask_token, 0, std::numeric_limits<std::int32_t>::max());
    if (tok.vocab_size) in_range("vocab-size", *tok.vocab_size, 1, std::size_t{1} << 31);
    in_range("cfg-scale", d.cfg_scale, 0, 1e6);
    in_range("threshold", d.confidence_threshold, 0, 1);
    in_range("cache-refresh", d.cache_refresh, 0, 1 << 20);
    if (kv_cache != "none" && kv_cache != "prefix" && kv_cache != "dual")
      throw po::error(fmt::format("--kv-cache {}: expected none, prefix or dual", kv_cache));
    in_range("temperature", temperature, 0, 1e6);
    in_range("top-k", top_k, 0, std::int64_t{1} << 31);
    if (!(top_p > 0 && top_p <= 1)) throw po::error(fmt::format("--top-p {}: expected a value in (0, 1]", top_p));
    in_range("threads", threads, 0, static_cast<int>(kMaxThreads));
    if (cuda.fp8_sampling && device == "cpu")
      throw po::error("--fp8: the CPU backend has no FP8 GEMMs (sample in FP8 with --device cuda)");
  } catch (const po::error& e) {
    fmt::print(stderr, "dlm-generate: {}\n(see dlm-generate --help)\n", e.what());
    return 2;
  }
  try {
    if (prompts.empty())
      for (std::string line; std::getline(std::cin, line);)
        if (!line.empty()) prompts.push_back(line);
    if (prompts.empty()) throw Error("no prompt: give --prompt or lines on stdin");
    auto tokenizer = data::make_tokenizer(tok);
    auto model = tools::open_generation_model(checkpoint, threads, device, cuda);
    const auto& special = tokenizer->special_ids();
    std::optional<std::int32_t> eos = model.config.eos_token_id ? model.config.eos_token_id : special.eos;
    if (!eos) eos = special.eod;
    if (no_eos_stop) eos.reset();
    std::vector<std::vector<std::int32_t>> ids;
    for (const auto& p : prompts) ids.push_back(tokenizer->encode(p));
    const bool diffusion = mode.empty() ? model.config.attention_mask == ckpt::AttentionMask::kBidirectional
                                        : mode == "diffusion";
    if (!mode.empty() && mode != "diffusion" && mode != "ar")
      throw Error(fmt::format("--mode: '{}' is not diffusion or ar", mode));
    std::int64_t forwards = 0;
    std::function<std::vector<std::vector<std::int32_t>>()> sample;
    if (diffusion) {
      d.gen_length = max_new;
      d.steps = steps > 0 ? steps : max_new;
      d.block_length = block > 0 ? block : max_new;
      d.temperature = temperature;
      d.top_p = top_p;
      d.remasking = train::parse_remasking(remasking);
      d.mask_token = mask_token >= 0 ? mask_token
                     : model.config.mask_token_id ? *model.config.mask_token_id
                                                  : special.mask.value_or(-1);
      d.eos = eos;
      d.pad_token = special.pad.value_or(0);
      d.seed = seed;
      d.kv_cache = train::parse_kv_cache(kv_cache);
      sample = [&] {
        return d.kv_cache == train::KvCache::kNone
                   ? train::diffusion_generate(model.logits, model.vocab, ids, d, &forwards, model.greedy)
                   : train::diffusion_generate_cached(model.cached, model.vocab, ids, d, &forwards);
      };
    } else {
      ar.max_new_tokens = max_new;
      ar.temperature = temperature;
      ar.top_k = top_k;
      ar.top_p = top_p;
      ar.eos = eos;
      ar.pad_token = special.pad.value_or(0);
      ar.seed = seed;
      sample = [&] { return train::ar_generate(model.logits, model.vocab, ids, ar); };
    }
    // --report-speed: the timed run repeats the warm-up's shapes, so per-shape algorithm choices and CUDA graph
    // captures are not in its time; a seed gives both runs the same tokens.
    if (report_speed) sample();
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::vector<std::int32_t>> out = sample();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (report_speed) {
      std::size_t tokens = 0;
      for (const auto& row : out) tokens += row.size();
      fmt::print(stderr, "dlm-generate: speed: {} rows, {} tokens in {:.4f} s, {:.1f} tokens/s, {} forwards\n",
                 out.size(), tokens, seconds, tokens / seconds, diffusion ? std::to_string(forwards) : "-");
    }
    // Prompt and continuation decoded together: tokenizers that join pieces (SentencePiece's word
    // boundary, NullTokenizer's spaces) place the seam as they would inside one text.
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::vector<std::int32_t> all = ids[i];
      all.insert(all.end(), out[i].begin(), out[i].end());
      fmt::print("{}\n", tokenizer->decode(all));
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dlm-generate: {}\n", user_message(e));
    return 1;
  }
}
