// One training step of dlm's CUDA model (forward, masked-diffusion loss, backward, clipping, AdamW), timed
// over several steps after a warm-up; prints one JSON line in torch_reference.py's form.
// usage: cuda_train_bench [--profile] [--dense-embedding] [--gaps] [--fp8 tensorwise|delayed]
//        [--fp8-amax-history-len N] CONFIG [STEPS [WARMUP [ACCUMULATE [RECOMPUTE [BATCH]]]]]
//   CONFIG: 350m | qwen3-1.7b | megadlm-1.7b | tiny | moe-2.9b | moe-tiny (torch_reference.py's CONFIGS; an MoE
//   configuration's MFU counts its active parameters: the router, top-k experts and shared expert of each layer)
// --profile: CudaOptions::profile, the GPU time of each phase of the timed steps on stderr (events after every
// phase: the step is slower than unprofiled). --dense-embedding: the embedding's whole gradient table is read and
// cleared (no set_sparse_embedding_grad). --gaps: the device's time within steps against the time it waits
// between them for the host, on stderr. --fp8 RECIPE: the layers' linear GEMMs in FP8 (CudaOptions::fp8, format
// hybrid, Megatron's defaults otherwise); "precision" in the JSON line says which. --fp8-amax-history-len N:
// delayed scaling from the max of an N-long amax history (Transformer Engine's DelayedScaling; N 1024 there).
// ACCUMULATE micro-batches per optimizer step (default 1); tokens/s counts all of them. RECOMPUTE: off (default)
// or full (each layer keeps its input only, CudaModel::set_recompute_layers). BATCH: the micro-batch size
// instead of the configuration's. The host's data work (the
// tokens, the objective's noising, the upload) for the next micro-batch overlaps the device's current one.
// The untied embedding's gradient is kept as dlm-train keeps it on one replica, as the rows the tokens wrote
// (CudaModel::set_sparse_embedding_grad) unless --dense-embedding.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dlm/train/cuda_model.h"
#include "dlm/train/fp8.h"
#include "dlm/train/objective.h"

namespace {

struct Shape {
  int layers, hidden, heads, groups, head_dim, ffn;
  long long vocab;
  int seq, batch;
  int experts = 0, topk = 0, moe_ffn = 0, shared = 0;  // every layer MoE when experts > 0 (softmax, aux 1e-2)
};

bool lookup(const std::string& name, Shape& s) {
  if (name == "350m") s = {24, 1024, 16, 8, 64, 2816, 50304, 2048, 8};
  else if (name == "qwen3-1.7b") s = {28, 2048, 16, 8, 128, 6144, 151936, 2048, 4};
  else if (name == "megadlm-1.7b") s = {28, 2048, 16, 16, 128, 6144, 50304, 2048, 4};
  else if (name == "tiny") s = {2, 64, 4, 2, 16, 176, 256, 32, 2};
  else if (name == "moe-2.9b") s = {12, 2048, 16, 8, 128, 1024, 50304, 2048, 4, 32, 4, 1024, 1024};
  else if (name == "moe-tiny") s = {2, 64, 4, 2, 16, 64, 256, 32, 2, 8, 2, 64, 32};
  else return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  dlm::train::CudaOptions options;
  bool dense_embedding = false, gaps = false;
  std::string precision = "bf16";
  std::vector<char*> args;  // argv without the flags
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fp8" && i + 1 < argc) {
      options.fp8.enabled = true;
      options.fp8.recipe = std::string(argv[++i]) == "tensorwise" ? dlm::train::Fp8Options::Recipe::kTensorwise
                                                                   : dlm::train::Fp8Options::Recipe::kDelayed;
      precision = std::string("fp8-hybrid-") + argv[i];
    } else if (a == "--fp8-amax-history-len" && i + 1 < argc) {
      options.fp8.amax_history_len = std::atoi(argv[++i]);
      options.fp8.amax_algo = dlm::train::Fp8Options::AmaxAlgo::kMax;  // the window's max, as Transformer Engine's
    } else if (a == "--profile") options.profile = true;
    else if (a == "--dense-embedding") dense_embedding = true;
    else if (a == "--gaps") gaps = true;
    else if (a == "--deterministic") options.deterministic = true;
    else args.push_back(argv[i]);
  }
  argc = static_cast<int>(args.size()), argv = args.data();
  Shape s{};
  if (argc < 2 || !lookup(argv[1], s)) {
    std::fprintf(stderr, "usage: cuda_train_bench [--profile] [--dense-embedding] [--gaps] [--deterministic] "
                         "[--fp8 tensorwise|delayed] "
                         "350m|qwen3-1.7b|megadlm-1.7b|tiny|moe-2.9b|moe-tiny [STEPS [WARMUP [ACCUMULATE [off|full "
                         "[BATCH]]]]]\n");
    return 2;
  }
  const int steps = argc > 2 ? std::atoi(argv[2]) : 10, warmup = argc > 3 ? std::atoi(argv[3]) : 3;
  // Micro-batches per optimizer step (gradient accumulation; 1: AdamW after every micro-batch).
  const int accumulate = argc > 4 ? std::atoi(argv[4]) : 1;
  const std::string recompute = argc > 5 ? argv[5] : "off";
  if (argc > 6) s.batch = std::atoi(argv[6]);
  if (steps < 1 || warmup < 0 || accumulate < 1 || s.batch < 1 || (recompute != "off" && recompute != "full") ||
      (precision != "bf16" && precision != "fp8-hybrid-tensorwise" && precision != "fp8-hybrid-delayed")) {
    std::fprintf(stderr, "cuda_train_bench: STEPS >= 1, WARMUP >= 0, ACCUMULATE >= 1, RECOMPUTE off or full, "
                         "BATCH >= 1, --fp8 tensorwise or delayed\n");
    return 2;
  }
  try {
    dlm::ckpt::ModelConfig c;
    c.num_layers = s.layers, c.hidden_size = s.hidden, c.num_attention_heads = s.heads;
    c.num_query_groups = s.groups, c.kv_channels = s.head_dim, c.ffn_hidden_size = s.ffn, c.vocab_size = s.vocab;
    c.max_position_embeddings = s.seq + 1, c.qk_layernorm = true, c.mask_token_id = static_cast<int>(s.vocab - 1);
    c.num_experts = s.experts, c.moe_router_topk = s.topk, c.moe_ffn_hidden_size = s.moe_ffn;
    c.moe_shared_expert_intermediate_size = s.shared;
    c.moe_aux_loss_coeff = s.experts > 0 ? 1e-2 : 0.0;
    dlm::train::CudaModel model(c, {}, options);
    model.set_recompute_layers(recompute == "full");
    // The embedding's gradient as dlm-train keeps it on one replica.
    model.set_sparse_embedding_grad(!dense_embedding);
    model.init(1);
    dlm::train::ObjectiveOptions o;
    o.mask_token = static_cast<int>(s.vocab - 1);
    o.varilen_prob = 0;
    dlm::train::AdamWOptions adam{0.9, 0.95, 1e-8, 0.1};
    std::mt19937 rng(0);
    // The sample has seq + 1 tokens so that the un-shifted input has seq positions, as in the torch reference.
    auto make = [&](std::uint64_t step, int m) {
      dlm::train::SampleBatch b;
      b.batch = s.batch, b.seq = s.seq + 1;
      for (long long i = 0; i < b.batch * b.seq; ++i) {
        b.tokens.push_back(static_cast<int>(rng() % (s.vocab - 1)));
        b.labels.push_back(static_cast<int>(rng() % (s.vocab - 1)));
      }
      b.loss_mask.assign(b.tokens.size(), 1.0f);
      for (int k = 0; k < s.batch; ++k) b.sample_index.push_back((step * accumulate + m) * s.batch + k);
      auto mb = dlm::train::make_model_batch(o, b, {static_cast<std::int64_t>(step), accumulate, m, true});
      for (float& w : mb.weights) w /= static_cast<float>(accumulate);  // the step's mean over its micro-batches
      return mb;
    };
    // As a trainer with a data loader runs: the host makes and uploads micro-batch j + 1 (into the other of two
    // input sets) while the device runs micro-batch j, so the device never waits for the host's noising, its
    // embedding plan or the copies; the host waits on the device once per step, for the norm and the loss.
    double loss = 0;
    int input = 0;
    auto upload = [&](std::uint64_t i, int m) {
      const auto mb = make(i, m);
      // The router losses weighted 1 / micro-batches, as the trainer weights them (and the reference its loss).
      model.upload_inputs(input, {mb.batch, mb.seq, mb.causal, mb.input_ids, mb.labels, mb.position_ids, mb.weights,
                                  1.0 / accumulate});
    };
    upload(0, 0);
    // --gaps: an event on the model's stream before each timed step's first kernel and after its last,
    // to tell the device's time within steps from the time it waits between them for the host.
    std::vector<cudaEvent_t> marks;
    const auto stream = static_cast<cudaStream_t>(model.stream());
    auto mark = [&] {
      if (!gaps) return;
      marks.emplace_back();
      cudaEventCreate(&marks.back());
      cudaEventRecord(marks.back(), stream);
    };
    auto step = [&](std::uint64_t i) {
      mark();
      for (int m = 0; m < accumulate; ++m) {
        model.forward_stage(input, 0, true);
        model.backward_stage(input, 0);
        input ^= 1;
        if (m + 1 < accumulate) upload(i, m + 1);
        else upload(i + 1, 0);
      }
      model.adamw_step(adam, 2e-4, 1.0);
      model.zero_grad();
      mark();
      loss = model.take_loss();
    };
    for (int i = 0; i < warmup; ++i) step(static_cast<std::uint64_t>(i));
    model.synchronize();
    marks.clear();
    (void)model.profile_report();  // the warm-up steps' times are not reported
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step(static_cast<std::uint64_t>(warmup + i));
    model.synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
    const double q = double(s.heads) * s.head_dim, kv = double(s.groups) * s.head_dim, d = s.hidden;
    const double mlp =
        s.experts > 0 ? d * s.experts + 3.0 * d * (double(s.topk) * s.moe_ffn + s.shared) : 3.0 * d * s.ffn;
    const double per_layer = d * (q + 2 * kv) + q * d + mlp + 2 * d + 2 * s.head_dim;
    const double params = s.layers * per_layer + d + double(s.vocab) * d;
    const double flops = 6 * params + 12.0 * s.layers * s.seq * q;
    const double tps = double(s.batch) * s.seq * accumulate / dt;
    std::printf(
        "{\"peer\": \"dlm\", \"mode\": \"train\", \"config\": \"%s\", \"batch\": %d, \"seq\": %d, \"accumulate\": %d, "
        "\"step_ms\": %.3f, \"tokens_per_s\": %.1f, \"mfu\": %.4f, \"loss\": %.5f, \"flops_per_token\": %.0f, "
        "\"peak_gib\": %.2f, \"attention\": \"%s\", \"recompute\": \"%s\", \"precision\": \"%s\"}\n",
        argv[1], s.batch, s.seq, accumulate, dt * 1e3, tps, tps * flops / 989e12, loss, flops,
        double(model.device_bytes()) / (1ull << 30), model.attention_engine().c_str(), recompute.c_str(),
        precision.c_str());
    if (options.profile) std::fprintf(stderr, "%s", model.profile_report().c_str());
    if (gaps && marks.size() >= 2) {
      double inside = 0, between = 0;
      for (std::size_t k = 0; k + 1 < marks.size(); ++k) {
        float ms = 0;
        cudaEventElapsedTime(&ms, marks[k], marks[k + 1]);
        (k % 2 == 0 ? inside : between) += ms;
      }
      std::fprintf(stderr, "device time a step %.3f ms (first kernel to last), between steps %.3f ms\n",
                   inside / steps, between / std::max(steps - 1, 1));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_train_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
