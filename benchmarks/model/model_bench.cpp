// Forward + cross-entropy + backward throughput of dlm's Model on the CPU backend (fp32), for
// bench_model.py to print beside transformers' Qwen3ForCausalLM in torch on the same shape.
// Prints: "params N tokens_per_s X ms_per_iter Y loss Z".
#include <chrono>
#include <cstdio>
#include <random>

#include <boost/program_options.hpp>

#include "dlm/train/model.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  dlm::ckpt::ModelConfig c;
  int batch = 4, seq = 256, iters = 5, threads = 0;
  po::options_description opts("model_bench");
  opts.add_options()("layers", po::value(&c.num_layers)->default_value(4))(
      "hidden", po::value(&c.hidden_size)->default_value(256))("ffn", po::value(&c.ffn_hidden_size)->default_value(768))(
      "heads", po::value(&c.num_attention_heads)->default_value(4))(
      "groups", po::value(&c.num_query_groups)->default_value(2))("vocab", po::value(&c.vocab_size)->default_value(50277))(
      "batch", po::value(&batch))("seq", po::value(&seq))("iters", po::value(&iters))("threads", po::value(&threads))(
      "causal", "causal attention (default bidirectional)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  po::notify(vm);
  c.kv_channels = c.hidden_size / c.num_attention_heads;
  c.qk_layernorm = true;
  c.max_position_embeddings = seq;
  c.attention_mask = vm.count("causal") ? dlm::ckpt::AttentionMask::kCausal : dlm::ckpt::AttentionMask::kBidirectional;

  auto backend = dlm::train::make_cpu_backend(threads);
  dlm::train::Model model(c, *backend);
  model.init(1);
  const std::size_t n = static_cast<std::size_t>(batch) * seq;
  std::mt19937 gen(0);
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(c.vocab_size - 1));
  std::vector<std::int32_t> ids(n), labels(n);
  for (auto& x : ids) x = token(gen);
  for (auto& x : labels) x = token(gen);
  const std::vector<float> weights(n, 1.0f / static_cast<float>(n));
  dlm::train::ModelInput in{batch, seq, ids, {}, {}, model.default_attention(), {}};

  double loss = 0;
  auto step = [&] {
    model.zero_grad();
    model.forward(in);
    auto ce = model.cross_entropy(labels);
    loss = 0;
    for (std::size_t i = 0; i < n; ++i) loss += weights[i] * ce[i];
    model.backward(weights);
  };
  step();  // warm-up: allocations, page faults
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) step();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("params %lld tokens_per_s %.1f ms_per_iter %.2f loss %.4f\n", static_cast<long long>(model.parameter_count()),
              double(n) * iters / s, 1e3 * s / iters, loss);
  return 0;
}
