// Diffusion sampling on the GPU with dlm's CUDA model: MegaDLMs' generate (greedy x0, low-confidence
// remasking, per-row top-k, blocks left to right, no cache), the same loop as torch_reference.py's
// generate; the argmax and its probability are computed on the device for the current block's columns
// (the only ones a step can change, as diffusion_generate asks), the selection on the host.
// KV_CACHE prefix|dual (and/or THRESHOLD > 0) runs dlm's sampler instead (diffusion_generate_cached, Fast-dLLM's
// block KV cache with REFRESH, and its parallel decoding; the greedy fast path on the device), as
// torch_reference.py's generate_cached on the PyTorch side.
// Random weights (as the torch side); prints one JSON line in torch_reference.py's form. With the cache, the line
// adds the mean wall time of a storing (full) and of a window forward call of the timed run (full_ms, window_ms: GPU
// work, the upload and the read-back), the rest of a step being the sampler's host work. The exact sampler's line adds
// decoded_as_mask: positions whose x0 was the mask id (random weights can choose it; such a position reads as a mask
// left, masks_left).
// usage: cuda_sample_bench [--profile] [--untuned] [--fp8] CONFIG BATCH
//          [PROMPT GEN STEPS BLOCK [KV_CACHE [THRESHOLD [REFRESH]]]]
//   CONFIG: megadlm-1.7b | qwen3-1.7b | tiny; KV_CACHE: none (default) | prefix | dual; THRESHOLD 0; REFRESH 0
// --profile: CudaOptions::profile (every forward eager, events after each phase: slower than unprofiled); after
// the timed run, the GPU time per phase on stderr of the forwards a step runs at the first and the last block: the
// exact forward, or the storing forward and the window forward of KV_CACHE.
// --untuned: CudaOptions::deterministic, every GEMM on the heuristic's first algorithm (gemm.h), the same binary's
// baseline for the GEMM tuning (a window step's GEMMs at batch 1 are all skinny shapes).
// --fp8: CudaOptions::fp8_sampling (dlm-generate --fp8), the layers' linear GEMMs in FP8 e4m3.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dlm/train/cuda_model.h"
#include "dlm/train/device.h"
#include "dlm/train/sampler.h"

namespace {

struct Run {
  dlm::train::CudaModel& model;
  int batch, prompt, mask;
  // Decoded positions whose x0 was the mask id itself (MegaDLMs' generate takes the argmax over the whole vocabulary,
  // the mask id included): they stay masks, and a block can end with one left (masks_left).
  long long decoded_as_mask = 0;
  std::vector<std::int32_t> generate(const std::vector<std::int32_t>& prompts, int gen, int steps, int block) {
    const int L = prompt + gen, blocks = gen / block, per_block = steps / blocks;
    std::vector<std::int32_t> x(static_cast<std::size_t>(batch) * L, mask), tok;
    std::vector<float> conf;
    for (int r = 0; r < batch; ++r)
      std::copy_n(prompts.begin() + r * prompt, prompt, x.begin() + static_cast<std::ptrdiff_t>(r) * L);
    std::vector<int> idx;
    for (int blk = 0; blk < blocks; ++blk) {
      const int lo = prompt + blk * block, hi = lo + block;
      std::vector<int> masked(static_cast<std::size_t>(batch));
      for (int r = 0; r < batch; ++r)
        masked[r] = static_cast<int>(std::count(x.begin() + r * L + lo, x.begin() + r * L + hi, mask));
      for (int i = 0; i < per_block; ++i) {
        // The columns a step can change (the prompts hold no mask): the block's rows alone reach the head.
        model.greedy_tokens(batch, L, false, x, {}, tok, conf, {lo, hi});
        for (int r = 0; r < batch; ++r) {
          const int k = masked[r] / per_block + (i < masked[r] % per_block ? 1 : 0);
          idx.clear();
          for (int j = 0; j < hi; ++j)
            if (x[r * L + j] == mask) idx.push_back(j);
          const int take = std::min<int>(k, static_cast<int>(idx.size()));
          std::partial_sort(idx.begin(), idx.begin() + take, idx.end(),
                            [&](int a, int b) { return conf[r * L + a] > conf[r * L + b]; });
          for (int t = 0; t < take; ++t) {
            x[r * L + idx[t]] = tok[r * L + idx[t]];
            decoded_as_mask += tok[r * L + idx[t]] == mask;
          }
        }
      }
    }
    return x;
  }
};

// Wall time of the calls of a sampler's model function.
struct CallClock {
  double seconds = 0;
  long long calls = 0;
  double ms() const { return calls ? 1e3 * seconds / static_cast<double>(calls) : 0.0; }
};
template <typename Fn>
Fn clocked(Fn fn, std::shared_ptr<CallClock> clock) {
  if (!fn) return fn;
  return [fn, clock](auto&&... args) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(args...);
    clock->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++clock->calls;
  };
}

// --profile: the phases of `call` (one forward) over `reps` calls after one unreported call, on stderr.
template <typename Call>
void print_phases(dlm::train::CudaModel& model, const std::string& what, int reps, Call&& call) {
  call();
  (void)model.profile_report();
  for (int i = 0; i < reps; ++i) call();
  std::fprintf(stderr, "== phases: %s\n%s", what.c_str(), model.profile_report().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  dlm::train::CudaOptions options;
  std::vector<char*> args;  // argv without the flags
  for (int i = 0; i < argc; ++i)
    if (std::string(argv[i]) == "--profile") options.profile = true;
    else if (std::string(argv[i]) == "--untuned") options.deterministic = true;
    else if (std::string(argv[i]) == "--fp8") options.fp8_sampling = true;
    else args.push_back(argv[i]);
  argc = static_cast<int>(args.size()), argv = args.data();
  if (argc < 3) {
    std::fprintf(stderr, "usage: cuda_sample_bench [--profile] [--untuned] [--fp8] megadlm-1.7b|qwen3-1.7b|tiny BATCH "
                         "[PROMPT GEN STEPS BLOCK [KV_CACHE [THRESHOLD [REFRESH]]]]\n");
    return 2;
  }
  const std::string name = argv[1];
  const int batch = std::atoi(argv[2]);
  const int prompt = argc > 3 ? std::atoi(argv[3]) : 64, gen = argc > 4 ? std::atoi(argv[4]) : 256;
  const int steps = argc > 5 ? std::atoi(argv[5]) : 256, block = argc > 6 ? std::atoi(argv[6]) : 32;
  const std::string kv_cache = argc > 7 ? argv[7] : "none";
  const double threshold = argc > 8 ? std::atof(argv[8]) : 0.0;
  const int refresh = argc > 9 ? std::atoi(argv[9]) : 0;
  dlm::ckpt::ModelConfig c;
  if (name == "megadlm-1.7b") c.num_layers = 28, c.hidden_size = 2048, c.num_attention_heads = 16, c.num_query_groups = 16,
                              c.kv_channels = 128, c.ffn_hidden_size = 6144, c.vocab_size = 50304;
  else if (name == "qwen3-1.7b") c.num_layers = 28, c.hidden_size = 2048, c.num_attention_heads = 16, c.num_query_groups = 8,
                                 c.kv_channels = 128, c.ffn_hidden_size = 6144, c.vocab_size = 151936;
  else if (name == "tiny") c.num_layers = 2, c.hidden_size = 64, c.num_attention_heads = 4, c.num_query_groups = 2,
                           c.kv_channels = 16, c.ffn_hidden_size = 176, c.vocab_size = 256;
  else {
    std::fprintf(stderr, "cuda_sample_bench: unknown config %s\n", name.c_str());
    return 2;
  }
  c.qk_layernorm = true, c.max_position_embeddings = prompt + gen + 1;
  c.mask_token_id = static_cast<int>(c.vocab_size - 1);
  try {
    auto model = std::make_shared<dlm::train::CudaModel>(c, dlm::train::CudaShard{}, options);
    model->init(1);
    std::mt19937 rng(0);
    std::vector<std::int32_t> prompts(static_cast<std::size_t>(batch) * prompt);
    for (auto& t : prompts) t = static_cast<std::int32_t>(rng() % (c.vocab_size - 1));
    const int mask = static_cast<int>(c.vocab_size - 1);
    std::int64_t forwards = steps;
    std::function<std::vector<std::int32_t>(int)> generate;  // the generated part of every row, given the steps
    Run exact{*model, batch, prompt, mask};
    const auto full_clock = std::make_shared<CallClock>(), window_clock = std::make_shared<CallClock>();
    if (kv_cache == "none" && threshold <= 0) {
      generate = [&](int s) {
        exact.decoded_as_mask = 0;
        auto x = exact.generate(prompts, gen, s, block);
        std::vector<std::int32_t> out;
        for (int r = 0; r < batch; ++r)
          out.insert(out.end(), x.begin() + static_cast<std::ptrdiff_t>(r) * (prompt + gen) + prompt,
                     x.begin() + static_cast<std::ptrdiff_t>(r + 1) * (prompt + gen));
        return out;
      };
    } else {
      dlm::train::CudaSampling sampling = dlm::train::cuda_sampling(model);
      auto& cached = sampling.cached;
      cached.full = clocked(cached.full, full_clock), cached.full_greedy = clocked(cached.full_greedy, full_clock);
      cached.window = clocked(cached.window, window_clock);
      cached.window_greedy = clocked(cached.window_greedy, window_clock);
      std::vector<std::vector<std::int32_t>> rows;
      for (int r = 0; r < batch; ++r)
        rows.emplace_back(prompts.begin() + static_cast<std::ptrdiff_t>(r) * prompt,
                          prompts.begin() + static_cast<std::ptrdiff_t>(r + 1) * prompt);
      generate = [&, sampling, rows](int s) {
        dlm::train::DiffusionSamplingOptions o;
        o.gen_length = gen, o.steps = s, o.block_length = block, o.mask_token = mask;
        o.confidence_threshold = threshold, o.kv_cache = dlm::train::parse_kv_cache(kv_cache), o.cache_refresh = refresh;
        const auto out = o.kv_cache == dlm::train::KvCache::kNone
                             ? dlm::train::diffusion_generate(sampling.logits, sampling.vocab, rows, o, &forwards,
                                                              sampling.greedy)
                             : dlm::train::diffusion_generate_cached(sampling.cached, sampling.vocab, rows, o, &forwards);
        std::vector<std::int32_t> flat;
        for (const auto& r : out) flat.insert(flat.end(), r.begin(), r.end());
        return flat;
      };
    }
    // Warm-up at the timed run's shapes, two steps per block (as the torch side: a full forward and, with the
    // cache, a window): cuDNN's graphs and cuBLASLt's algorithms are chosen per shape, and a warm-up at another
    // length left that in the timing. Twice: a forward shape runs eagerly at its first call and is captured as a
    // CUDA graph at its second (forward_graphs.h), so the timed run replays every shape (a prefix window's width,
    // and so its shape, changes with the block).
    generate(2 * (gen / block));
    generate(2 * (gen / block));
    *full_clock = {}, *window_clock = {};
    (void)model->profile_report();
    const auto t0 = std::chrono::steady_clock::now();
    const auto x = generate(steps);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto left = std::count(x.begin(), x.end(), mask);
    std::string calls;
    if (kv_cache == "none" && threshold <= 0) calls = "\"decoded_as_mask\": " + std::to_string(exact.decoded_as_mask) + ", ";
    if (full_clock->calls + window_clock->calls > 0)
      calls = "\"full_forwards\": " + std::to_string(full_clock->calls) + ", \"full_ms\": " +
              std::to_string(full_clock->ms()) + ", \"window_forwards\": " + std::to_string(window_clock->calls) +
              ", \"window_ms\": " + std::to_string(window_clock->ms()) + ", ";
    std::printf("{\"peer\": \"dlm\", \"mode\": \"sample\", \"config\": \"%s\", \"fp8\": %s, \"batch\": %d, \"prompt\": %d, \"gen\": %d, "
                "\"steps\": %d, \"block\": %d, \"kv_cache\": \"%s\", \"cache_refresh\": %d, \"threshold\": %g, "
                "\"forwards\": %lld, %s\"seconds\": %.4f, \"tokens_per_s\": %.2f, \"first\": %d, \"masks_left\": %lld}\n",
                name.c_str(), options.fp8_sampling ? "true" : "false", batch, prompt, gen, steps, block, kv_cache.c_str(), refresh, threshold,
                static_cast<long long>(forwards), calls.c_str(), dt, batch * gen / dt, x.empty() ? -1 : x[0],
                static_cast<long long>(left));
    if (options.profile) {
      std::fprintf(stderr, "== phases: every forward of the timed run\n%s", model->profile_report().c_str());
      // The forwards of a step on their own, at the first block and the last (a prefix window spans the rest).
      const int L = prompt + gen;
      std::vector<std::int32_t> ids(static_cast<std::size_t>(batch) * L, mask), tok;
      std::vector<float> conf;
      for (int r = 0; r < batch; ++r)
        std::copy_n(prompts.begin() + r * prompt, prompt, ids.begin() + static_cast<std::ptrdiff_t>(r) * L);
      using Mode = dlm::train::KvCacheUse::Mode;
      for (const int blk : {0, gen / block - 1}) {
        const int lo = prompt + blk * block, hi = kv_cache == "dual" ? lo + block : L;
        const dlm::train::ColumnWindow head{lo, lo + block};
        if (kv_cache == "none") {
          print_phases(*model, "exact forward, block " + std::to_string(blk), 10,
                       [&] { model->greedy_tokens(batch, L, false, ids, {}, tok, conf, head); });
          continue;
        }
        print_phases(*model, "storing forward, block " + std::to_string(blk), 10,
                     [&] { model->greedy_tokens(batch, L, false, ids, {}, tok, conf, head, {Mode::kStore, 0}); });
        print_phases(*model,
                     "window forward [" + std::to_string(lo) + ", " + std::to_string(hi) + "), block " +
                         std::to_string(blk),
                     20, [&] {
                       model->greedy_tokens(batch, L, false, ids, {}, tok, conf, head, {Mode::kWindow, 0, {lo, hi}});
                     });
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_sample_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
