// Diffusion sampling on the GPU with dlm's CUDA model: MegaDLMs' generate (greedy x0, low-confidence
// remasking, per-row top-k, blocks left to right, no cache), the same loop as torch_reference.py's
// generate; the argmax and its probability are computed on the device for the current block's columns
// (the only ones a step can change, as diffusion_generate asks), the selection on the host.
// Random weights (as the torch side); prints one JSON line in torch_reference.py's form.
// usage: cuda_sample_bench CONFIG BATCH [PROMPT GEN STEPS BLOCK]   CONFIG: megadlm-1.7b | qwen3-1.7b | tiny
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dlm/train/cuda_model.h"

namespace {

struct Run {
  dlm::train::CudaModel& model;
  int batch, prompt, mask;
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
          for (int t = 0; t < take; ++t) x[r * L + idx[t]] = tok[r * L + idx[t]];
        }
      }
    }
    return x;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: cuda_sample_bench megadlm-1.7b|qwen3-1.7b|tiny BATCH [PROMPT GEN STEPS BLOCK]\n");
    return 2;
  }
  const std::string name = argv[1];
  const int batch = std::atoi(argv[2]);
  const int prompt = argc > 3 ? std::atoi(argv[3]) : 64, gen = argc > 4 ? std::atoi(argv[4]) : 256;
  const int steps = argc > 5 ? std::atoi(argv[5]) : 256, block = argc > 6 ? std::atoi(argv[6]) : 32;
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
    dlm::train::CudaModel model(c);
    model.init(1);
    std::mt19937 rng(0);
    std::vector<std::int32_t> prompts(static_cast<std::size_t>(batch) * prompt);
    for (auto& t : prompts) t = static_cast<std::int32_t>(rng() % (c.vocab_size - 1));
    Run run{model, batch, prompt, static_cast<int>(c.vocab_size - 1)};
    // Warm-up at the timed run's shapes, one step per block (as the torch side): cuDNN's graphs and
    // cuBLASLt's algorithms are chosen per shape, and a warm-up at another length left that in the timing.
    run.generate(prompts, gen, gen / block, block);
    const auto t0 = std::chrono::steady_clock::now();
    const auto x = run.generate(prompts, gen, steps, block);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto left = std::count(x.begin(), x.end(), c.vocab_size - 1);
    std::printf("{\"peer\": \"dlm\", \"mode\": \"sample\", \"config\": \"%s\", \"batch\": %d, \"prompt\": %d, \"gen\": %d, "
                "\"steps\": %d, \"block\": %d, \"seconds\": %.4f, \"tokens_per_s\": %.2f, \"first\": %d, \"masks_left\": %lld}\n",
                name.c_str(), batch, prompt, gen, steps, block, dt, batch * gen / dt, x[prompt],
                static_cast<long long>(left));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_sample_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
