// Host cost of the diffusion sampler (everything but the model): one fixed logits tensor is served
// at every step, so the time is the sampler's own (softmax64, Gumbel noise, selection).
// usage: sampler_bench VOCAB PROMPT GEN STEPS BLOCK TEMPERATURE REMASKING
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dlm/train/sampler.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: sampler_bench VOCAB PROMPT GEN STEPS BLOCK TEMPERATURE REMASKING\n");
    return 2;
  }
  const std::int64_t vocab = std::atoll(argv[1]), prompt = std::atoll(argv[2]);
  dlm::train::DiffusionSamplingOptions o;
  o.gen_length = std::atoll(argv[3]);
  o.steps = std::atoll(argv[4]);
  o.block_length = std::atoll(argv[5]);
  o.temperature = std::atof(argv[6]);
  o.remasking = dlm::train::parse_remasking(argv[7]);
  o.mask_token = static_cast<std::int32_t>(vocab - 1);
  std::vector<float> fixed(static_cast<std::size_t>((prompt + o.gen_length) * vocab));
  std::uint64_t x = 88172645463325252ull;
  for (float& v : fixed) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 8.0 - 4.0);
  }
  std::int64_t calls = 0;
  dlm::train::LogitsFn model = [&](const dlm::train::SequenceBatch&, std::vector<float>& logits) {
    ++calls;
    if (logits.size() != fixed.size()) logits = fixed;  // the sampler keeps its buffer between steps
  };
  std::vector<std::vector<std::int32_t>> prompts = {std::vector<std::int32_t>(static_cast<std::size_t>(prompt), 5)};
  const auto t0 = std::chrono::steady_clock::now();
  auto out = dlm::train::diffusion_generate(model, vocab, prompts, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"seconds\": %.6f, \"steps\": %lld, \"first\": %d}\n", s, static_cast<long long>(calls),
              out[0].empty() ? -1 : out[0][0]);
  return 0;
}
