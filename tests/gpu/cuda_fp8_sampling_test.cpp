// FP8 sampling (CudaOptions::fp8_sampling, Fp8Linears' forward-only use, the output layer included): the FP8
// forward's logits are as far from the bf16 forward's as an independent emulation of the recipe puts them (any row
// count, 16 or not); a storing forward is the plain FP8 forward bit for bit and a window right after it gives the full
// FP8 forward's rows within FP8 rounding (its inputs cast with the store's scales); the greedy head of a window of
// columns gives the argmax of the FP8 logits there; the exact and the cached samplers run and decode every position,
// refreshed every step the cached one is the exact one token for token; a captured forward replays the eager one bit
// for bit, weights imported after the capture included (cast again outside the graph).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dlm/train/cuda_model.h"
#include "dlm/train/device.h"
#include "dlm/train/sampler.h"
#include "gpu_test_util.h"
#include "sampling_test_util.h"

namespace dlm::train {
namespace {

using Mode = KvCacheUse::Mode;

// The small test model with every linear width a multiple of 16 (qkv 256, proj 128, fc1 768, fc2 384 wide) and
// weights large enough that attention is far from uniform and the logits spread over a few units.
ckpt::ModelConfig sampling_config() {
  auto c = gpu_test::small_config();
  c.ffn_hidden_size = 384, c.init_method_std = 0.05;
  return c;
}

CudaOptions fp8_options() {
  CudaOptions o;
  o.fp8_sampling = true;
  return o;
}

using gpu_test::agreement;
using gpu_test::columns;
using gpu_test::random_ids;

// ||a - b|| / ||b|| in double.
double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  return gpu_test::rel_error(a, std::vector<double>(b.begin(), b.end()));
}

// The FP8 forward's distance from bf16's is what the recipe gives on this model and these inputs, emulated
// independently of dlm's kernels (benchmarks/train/fp8_emulation.py --sampling-forward: PyTorch on the CPU, dlm's
// initial weights, the same ids; tensorwise e4m3 casts of each GEMM's operands, fp32 GEMMs on the dequantized values):
// the logits' relative L2 error per shape below. Each GEMM's operand rounding (~0.04 norm-wise, Fp8Gemm's test)
// compounds over the two layers' eight GEMMs and the output layer's to 0.12-0.15. The GPU must land within 10% of the
// emulation's value (the two bf16 paths, cuDNN's attention against PyTorch's, differ by under 1%); a wrong scale (a
// weight's amax read as an input's, a stale scale_inv) moves the logits by orders of magnitude, bf16 alone by nothing.
struct EmulatedShape {
  std::int64_t batch, seq;
  double emulated;
};
constexpr double kEmulationBand = 0.10;

class CudaFp8Sampling : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaFp8Sampling, ForwardFollowsBf16WithinFp8Error) {
  const auto c = sampling_config();
  const auto bf16 = gpu_test::model_with(c, {}, 41), fp8 = gpu_test::model_with(c, fp8_options(), 41);
  std::mt19937 rng(1);
  // 2 x 40 = 80 rows (a multiple of 16), 1 x 37 and 3 x 23 (not); 40 x 128 and 41 x 125 (5120 and 5125 rows).
  for (const auto [batch, seq, emulated] : {EmulatedShape{2, 40, 0.1429}, {1, 37, 0.1313}, {3, 23, 0.1215},
                                            {40, 128, 0.1257}, {41, 125, 0.1269}}) {
    SCOPED_TRACE(::testing::Message() << batch << " x " << seq);
    const auto ids = random_ids(rng, batch * seq);
    const auto want = bf16->forward_logits(batch, seq, false, ids, {});
    const auto got = fp8->forward_logits(batch, seq, false, ids, {});
    ASSERT_EQ(got.size(), want.size());
    const double err = rel_error(got, want), cos = gpu_test::cosine(got, want);
    std::printf("[fp8 sampling] %lld x %lld: logits relative error %.4f (emulated %.4f), cosine %.6f\n",
                static_cast<long long>(batch), static_cast<long long>(seq), err, emulated, cos);
    EXPECT_NEAR(err, emulated, kEmulationBand * emulated);
    EXPECT_GT(cos, 0.99);
    EXPECT_EQ(fp8->forward_logits(batch, seq, false, ids, {}), got) << "a second forward (the same scales)";
  }
}

// A window's inputs are cast with the scales of the storing forward that filled its store: its rows differ from the
// full forward's by FP8 rounding of slightly different bf16 values (the window attention's against cuDNN's). Both
// are the exact forward plus an FP8 rounding error of the size the FP8 forward's distance from bf16 measures (e);
// where the two roundings are independent their difference is sqrt(2) e, and they share the weights' rounding (the
// same copies), so sqrt(2) e bounds it. The bf16 model's window shows what bf16 alone gives (about 1%). The scales
// are the store's own: a storing forward of other tokens into another store between two windows over the first
// changes nothing of the second window.
TEST_F(CudaFp8Sampling, AWindowAfterAStoringForwardIsTheFullFp8ForwardsRows) {
  const auto c = sampling_config();
  const auto bf16 = gpu_test::model_with(c, {}, 42), fp8 = gpu_test::model_with(c, fp8_options(), 42);
  const std::int64_t batch = 2, seq = 64, V = c.vocab_size;
  std::mt19937 rng(3);
  const auto ids = random_ids(rng, batch * seq);
  const auto plain = fp8->forward_logits(batch, seq, false, ids, {});
  EXPECT_EQ(fp8->forward_logits(batch, seq, false, ids, {}, {Mode::kStore, 0}), plain);  // the store's copies beside
  const double fp8_vs_bf16 = rel_error(plain, bf16->forward_logits(batch, seq, false, ids, {}));
  bf16->forward_logits(batch, seq, false, ids, {}, {Mode::kStore, 0});
  const auto bf16_plain = bf16->forward_logits(batch, seq, false, ids, {});
  for (const ColumnWindow w : {ColumnWindow{32, 64}, ColumnWindow{16, 48}, ColumnWindow{5, 40}, ColumnWindow{0, 64}}) {
    SCOPED_TRACE(::testing::Message() << "window [" << w.first << ", " << w.end << ")");
    const auto window = fp8->forward_logits(batch, seq, false, ids, {}, {Mode::kWindow, 0, w});
    const auto want = columns(plain, batch, seq, V, w.first, w.end);
    ASSERT_EQ(window.size(), want.size());
    const double err = rel_error(window, want);
    const double bf16_err = rel_error(bf16->forward_logits(batch, seq, false, ids, {}, {Mode::kWindow, 0, w}),
                                      columns(bf16_plain, batch, seq, V, w.first, w.end));
    std::printf("[fp8 window] [%lld, %lld): relative error to the full FP8 forward %.4f (bf16's window: %.5f; FP8 vs "
                "bf16 forward %.4f)\n", static_cast<long long>(w.first), static_cast<long long>(w.end), err, bf16_err,
                fp8_vs_bf16);
    EXPECT_LT(err, std::sqrt(2.0) * fp8_vs_bf16);
    EXPECT_GT(gpu_test::cosine(window, want), 0.99);
  }
  const ColumnWindow w{16, 48};
  const auto before = fp8->forward_logits(batch, seq, false, ids, {}, {Mode::kWindow, 0, w});
  auto other = random_ids(rng, batch * seq);
  fp8->forward_logits(batch, seq, false, other, {}, {Mode::kStore, 1});  // other inputs, other amaxes
  EXPECT_EQ(fp8->forward_logits(batch, seq, false, ids, {}, {Mode::kWindow, 0, w}), before)
      << "a window over store 0 after a storing forward into store 1";
}

// Three padding groups (gpu_test::three_prompts): rows of 29, 27 and 25 columns, no multiple of 16.
void expect_decoded(const std::vector<std::vector<std::int32_t>>& rows, std::int64_t vocab, const std::string& what) {
  ASSERT_EQ(rows.size(), 3u) << what;
  for (const auto& row : rows) {
    EXPECT_EQ(row.size(), 24u) << what;  // no eos: every row decoded whole
    for (const std::int32_t t : row) {
      EXPECT_GE(t, 0) << what;
      EXPECT_LT(t, vocab) << what;
    }
  }
}

// The greedy head of a window of columns reads the final norm's FP8 rows of those columns alone (gathered from the
// forward's FP8 rows) and gives the argmax and probability of the FP8 logits there, on calls eager, captured and
// replayed; the output layer's FP8 logits are the forward's (forward_logits).
TEST_F(CudaFp8Sampling, GreedyTokensOfAWindowAreTheArgmaxOfTheFp8Logits) {
  const auto c = sampling_config();
  const auto fp8 = gpu_test::model_with(c, fp8_options(), 45);
  std::mt19937 rng(12);
  const std::int64_t batch = 3, seq = 40;
  const ColumnWindow window{5, 29};
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call);
    const auto ids = random_ids(rng, batch * seq);
    std::vector<std::int32_t> tokens;
    std::vector<float> confidence;
    fp8->greedy_tokens(batch, seq, false, ids, {}, tokens, confidence, window);
    const auto logits = fp8->forward_logits(batch, seq, false, ids, {});
    const std::int64_t vocab = c.vocab_size;
    for (std::int64_t r = 0; r < batch; ++r)
      for (std::int64_t j = window.first; j < window.end; ++j) {
        const auto i = r * seq + j;
        const float* row = logits.data() + i * vocab;
        std::int64_t best = 0;
        for (std::int64_t v = 1; v < vocab; ++v)
          if (row[v] > row[best]) best = v;
        double sum = 0;
        for (std::int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - row[best]);
        // The same FP8 rows through the same weights, fewer of them: cuBLASLt may pick another kernel.
        EXPECT_EQ(tokens[static_cast<std::size_t>(i)], best) << "row " << r << " column " << j;
        EXPECT_NEAR(confidence[static_cast<std::size_t>(i)], 1.0 / sum, 2e-3 / sum + 1e-6)
            << "row " << r << " column " << j;
      }
  }
}

// A vocabulary padded to no multiple of 16 (--make-vocab-size-divisible-by 8: 500 tokens in 504 rows; CudaModel takes
// multiples of 8) is no FP8 GEMM width: the output layer stays bf16 and the layers run in FP8 as before; the logits
// follow bf16's within FP8 error (the layers' rounding alone) and the greedy head gives their argmax.
TEST_F(CudaFp8Sampling, AnOutputLayerNoFp8GemmTakesStaysBf16) {
  auto c = sampling_config();
  c.make_vocab_size_divisible_by = 8;
  ASSERT_NE(c.padded_vocab_size() % 16, 0);
  const auto bf16 = gpu_test::model_with(c, {}, 46), fp8 = gpu_test::model_with(c, fp8_options(), 46);
  std::mt19937 rng(13);
  const std::int64_t batch = 2, seq = 24;
  const auto ids = random_ids(rng, batch * seq);
  const auto want = bf16->forward_logits(batch, seq, false, ids, {});
  const auto got = fp8->forward_logits(batch, seq, false, ids, {});
  ASSERT_EQ(got.size(), want.size());
  EXPECT_GT(rel_error(got, want), 0.01) << "the layers ran in bf16";
  EXPECT_GT(gpu_test::cosine(got, want), 0.99);
  std::vector<std::int32_t> tokens;
  std::vector<float> confidence;
  fp8->greedy_tokens(batch, seq, false, ids, {}, tokens, confidence);
  for (std::int64_t i = 0; i < batch * seq; ++i) {
    const float* row = got.data() + i * c.vocab_size;
    EXPECT_EQ(tokens[static_cast<std::size_t>(i)], std::max_element(row, row + c.vocab_size) - row) << "row " << i;
  }
}

TEST_F(CudaFp8Sampling, ExactAndCachedSamplersDecodeEveryPosition) {
  const auto c = sampling_config();
  const std::shared_ptr<CudaModel> fp8 = gpu_test::model_with(c, fp8_options(), 43),
                                   bf16 = gpu_test::model_with(c, {}, 43);
  const CudaSampling s = cuda_sampling(fp8), b = cuda_sampling(bf16);
  const auto p = gpu_test::three_prompts();
  for (const double threshold : {0.0, 0.3}) {
    auto o = gpu_test::sampling_options(KvCache::kNone, 0);
    o.confidence_threshold = threshold;
    const auto exact = diffusion_generate(s.logits, s.vocab, p, o, nullptr, s.greedy);
    expect_decoded(exact, c.vocab_size, "exact");
    const double with_bf16 = agreement(exact, diffusion_generate(b.logits, b.vocab, p, o, nullptr, b.greedy));
    for (KvCache mode : {KvCache::kPrefix, KvCache::kDual}) {
      const std::string what = std::string(mode == KvCache::kDual ? "dual" : "prefix") + " threshold " +
                               std::to_string(threshold);
      o.kv_cache = mode, o.cache_refresh = 1;
      EXPECT_EQ(diffusion_generate_cached(s.cached, s.vocab, p, o), exact) << what << ", refreshed every step";
      o.cache_refresh = 0;
      const auto cached = diffusion_generate_cached(s.cached, s.vocab, p, o);
      expect_decoded(cached, c.vocab_size, what);
      std::printf("[fp8 sampler] %s: token agreement with the FP8 exact sampler %.3f (FP8 vs bf16 exact: %.3f)\n",
                  what.c_str(), agreement(cached, exact), with_bf16);
      o.kv_cache = KvCache::kNone;
    }
  }
}

// The graphed model gives the eager model's tokens and confidences bit for bit, on calls eager (the first), captured
// (the second) and replayed, for the exact forward, the storing forward and the dual cache's window; then again after
// a weight changed (imported into both): the FP8 copies are cast again before the replay, outside the graph.
TEST_F(CudaFp8Sampling, GraphReplayIsTheEagerForward) {
  CudaOptions graphed = fp8_options(), eager = fp8_options();
  graphed.deterministic = eager.deterministic = true;  // the same GEMM algorithms in both models
  eager.cuda_graphs = false;
  const auto c = sampling_config();
  const auto a = gpu_test::model_with(c, graphed, 44), e = gpu_test::model_with(c, eager, 44);
  const std::int64_t batch = 2, seq = 32, width = 8;
  std::mt19937 rng(6);
  const auto ids = random_ids(rng, batch * seq);
  a->forward_logits(batch, seq, false, ids, {}, {Mode::kStore, 0});
  e->forward_logits(batch, seq, false, ids, {}, {Mode::kStore, 0});
  gpu_test::expect_graphs_replay_eager(*a, *e, ids, batch, seq, width, rng, "first weights: ");
  std::vector<std::int32_t> tokens;
  std::vector<float> before, after;
  a->greedy_tokens(batch, seq, false, ids, {}, tokens, before, {0, width});
  const std::string name = "decoder.layers.0.mlp.linear_fc1.weight";
  auto w = a->export_parameter(name);
  for (auto& v : w) v *= 3.0f;
  a->import_parameter(name, w), e->import_parameter(name, w);
  a->greedy_tokens(batch, seq, false, ids, {}, tokens, after, {0, width});
  EXPECT_NE(after, before) << "the replayed forward did not see the new weight";
  gpu_test::expect_graphs_replay_eager(*a, *e, ids, batch, seq, width, rng, "changed weights: ");
}

}  // namespace
}  // namespace dlm::train
