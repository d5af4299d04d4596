// CudaModel's mixture-of-experts layers (backend/cuda/moe_layer.h) against the CPU reference:
//   - the router kernel on the same fp32 logits as dlm::train::route(): the same experts (no near ties drawn),
//     weights within 1e-5, and the logits' gradient (aux and z losses included) against route_backward(); with a
//     capacity factor (both drop policies), the same kept slots and the backward's dropped slots and capped counts;
//   - the sort by expert against a stable host sort, with experts that get no slot and uneven counts, and the
//     permutation's row copies (gather and expand) against the host's, and the experts' SwiGLU backward;
//   - the grouped GEMMs (all three forms) against a host reference, with empty experts (their weight gradient
//     untouched) and uneven counts, and replayed from a CUDA graph on other counts;
//   - whole MoE models (softmax and sigmoid routers, all-MoE and mixed layer patterns, a shared expert, a capacity
//     factor) against the
//     CPU backend's Model on the same weights and micro-batch: the loss, the logits, every gradient by cosine, and the
//     tokens each expert got per layer, equal. The router reads a spike that each token's embedding row carries, so its top-k
//     has gaps far larger than bf16's rounding and the GPU routes every token as the CPU does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/grouped_gemm.h"
#include "backend/cuda/moe_kernels.h"
#include "dlm/common/error.h"
#include "dlm/train/moe_router.h"
#include "gpu_test_util.h"

namespace dlm::train {
namespace {

using cuda::bf16;
using gpu_test::DeviceVec;

// ---- the router kernel ----

struct RouterCase {
  const char* name;
  ckpt::MoeScoreFunction score;
  bool norm;
};

// Logits whose k + 1 largest of every token are at least 1e-3 apart (redrawn otherwise): the top-k, its order and
// the first one left out are decided by more than float rounding, for softmax and sigmoid scores alike.
std::vector<float> untied_logits(std::mt19937& rng, int tokens, int experts, int k) {
  std::normal_distribution<float> dist(0.0f, 1.5f);
  std::vector<float> out(static_cast<std::size_t>(tokens) * experts), row(static_cast<std::size_t>(experts));
  for (int n = 0; n < tokens; ++n) {
    for (;;) {
      for (auto& v : row) v = dist(rng);
      std::vector<float> sorted = row;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      bool apart = true;
      for (int j = 0; j < k; ++j) apart = apart && sorted[static_cast<std::size_t>(j)] - sorted[j + 1u] > 1e-3f;
      if (apart) break;
    }
    std::copy(row.begin(), row.end(), out.begin() + static_cast<std::ptrdiff_t>(n) * experts);
  }
  return out;
}

TEST(CudaMoeRouter, MatchesHostRouterForwardAndBackward) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const int N = 300, E = 40, k = 6;  // 40 experts: two a lane
  const RouterCase cases[] = {{"softmax, normalised", ckpt::MoeScoreFunction::kSoftmax, true},
                              {"softmax", ckpt::MoeScoreFunction::kSoftmax, false},
                              {"sigmoid, normalised", ckpt::MoeScoreFunction::kSigmoid, true},
                              {"sigmoid", ckpt::MoeScoreFunction::kSigmoid, false}};
  std::mt19937 rng(5);
  for (const auto& c : cases) {
    const RouterOptions o{E, k, c.score, c.norm, 0.01, 0.001};
    const auto logits = untied_logits(rng, N, E, k);
    const Routing want = route(o, logits);
    DeviceVec<float> dl(logits), w(static_cast<std::size_t>(N) * k);
    DeviceVec<int> idx(static_cast<std::size_t>(N) * k);
    const cuda::RouterShape shape{N, E, k, c.score == ckpt::MoeScoreFunction::kSigmoid, c.norm};
    cuda::moe_router_forward(shape, dl.get(), idx.get(), w.get(), nullptr);
    const auto got_idx = idx.download();
    const auto got_w = w.download();
    EXPECT_EQ(got_idx, want.experts) << c.name;
    for (std::size_t i = 0; i < got_w.size(); ++i) ASSERT_NEAR(got_w[i], want.weights[i], 1e-5) << c.name << " " << i;

    // Backward: random weight gradients, the aux counts from the routing, loss weight 0.5.
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> dweights(static_cast<std::size_t>(N) * k);
    for (auto& v : dweights) v = dist(rng);
    std::vector<float> want_dl(static_cast<std::size_t>(N) * E);
    route_backward(o, want, dweights, 0.5, want_dl);
    std::vector<int> offsets(E + 1, 0);
    for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + static_cast<int>(want.tokens_per_expert[e]);
    DeviceVec<float> ddw(dweights);
    DeviceVec<int> doff(offsets);
    DeviceVec<bf16> dlog(static_cast<std::size_t>(N) * E);
    const auto aux = static_cast<float>(0.5 * 0.01 * E / (double(k) * N * N)), z = static_cast<float>(0.5 * 0.001 * 2 / N);
    cuda::moe_router_backward(shape, dl.get(), idx.get(), w.get(), ddw.get(), doff.get(), nullptr, 0, aux, z, dlog.get(),
                              nullptr);
    const auto got_dl = gpu_test::to_float(dlog.download());
    double worst = 0, most = 0;
    for (std::size_t i = 0; i < want_dl.size(); ++i) {
      worst = std::max(worst, double(std::abs(got_dl[i] - want_dl[i])));
      most = std::max(most, double(std::abs(want_dl[i])));
    }
    EXPECT_GE(gpu_test::cosine(got_dl, want_dl), 0.99999) << c.name;
    EXPECT_LE(worst, 1e-2 * most) << c.name;
  }
}

// The capacity drop (moe_drop_over_capacity after the router kernel and the sort) against route() with a capacity
// factor, both policies: the same kept slots, a dropped slot's weight 0 and the others' the host's; then the router
// backward with the kept flags and the capped counts against route_backward(). The weights of each expert's slots are
// at least 2e-5 apart (logits redrawn otherwise), so the probs policy's ranking is decided by more than float rounding.
TEST(CudaMoeRouter, CapacityDropMatchesHostRouter) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const int N = 120, E = 8, k = 2;
  std::mt19937 rng(13);
  for (const auto policy : {ckpt::MoeDropPolicy::kProbs, ckpt::MoeDropPolicy::kPosition})
    for (const double factor : {0.5, 1.0}) {
      const std::string what = std::string(policy == ckpt::MoeDropPolicy::kProbs ? "probs" : "position") +
                               ", factor " + std::to_string(factor);
      const RouterOptions o{E, k, ckpt::MoeScoreFunction::kSoftmax, true, 0.01, 0.001, factor, policy};
      RouterOptions dropless = o;
      dropless.capacity_factor = 0;
      std::vector<float> logits;
      for (bool apart = false; !apart;) {
        logits = untied_logits(rng, N, E, k);
        const Routing all = route(dropless, logits);
        std::vector<std::vector<float>> by_expert(E);
        for (std::size_t i = 0; i < all.experts.size(); ++i) by_expert[all.experts[i]].push_back(all.weights[i]);
        apart = true;
        for (auto& ws : by_expert) {
          std::sort(ws.begin(), ws.end());
          for (std::size_t i = 1; i < ws.size(); ++i) apart = apart && ws[i] - ws[i - 1] >= 2e-5f;
        }
      }
      const Routing want = route(o, logits);
      const int slots = N * k;
      DeviceVec<float> dl(logits), w(static_cast<std::size_t>(slots));
      DeviceVec<int> idx(static_cast<std::size_t>(slots)), where(static_cast<std::size_t>(slots));
      DeviceVec<int> order(static_cast<std::size_t>(slots)), off(static_cast<std::size_t>(E) + 1);
      DeviceVec<int> scratch(static_cast<std::size_t>(cuda::moe_sort_scratch_ints(slots, E)));
      DeviceVec<std::uint8_t> kept(static_cast<std::size_t>(slots));
      const cuda::RouterShape shape{N, E, k, false, true};
      cuda::moe_router_forward(shape, dl.get(), idx.get(), w.get(), nullptr);
      cuda::moe_sort_by_expert(idx.get(), slots, E, scratch.get(), off.get(), where.get(), order.get(), nullptr);
      const int capacity = static_cast<int>(want.capacity);
      cuda::moe_drop_over_capacity(idx.get(), order.get(), off.get(), slots, capacity,
                                   policy == ckpt::MoeDropPolicy::kPosition, w.get(), kept.get(), nullptr);
      EXPECT_EQ(kept.download(), want.kept) << what;
      const auto got_w = w.download();
      for (std::size_t i = 0; i < got_w.size(); ++i) ASSERT_NEAR(got_w[i], want.weights[i], 1e-5) << what << " " << i;
      std::int64_t dropped = 0;
      for (auto v : want.kept) dropped += v == 0;
      if (factor < 1.0) EXPECT_GT(dropped, 0) << what;

      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<float> dweights(static_cast<std::size_t>(slots)), want_dl(static_cast<std::size_t>(N) * E);
      for (auto& v : dweights) v = dist(rng);
      route_backward(o, want, dweights, 0.5, want_dl);
      DeviceVec<float> ddw(dweights);
      DeviceVec<bf16> dlog(static_cast<std::size_t>(N) * E);
      const auto aux = static_cast<float>(0.5 * 0.01 * E / (double(k) * N * N)), z = static_cast<float>(0.5 * 0.001 * 2 / N);
      cuda::moe_router_backward(shape, dl.get(), idx.get(), w.get(), ddw.get(), off.get(), kept.get(), capacity, aux, z,
                                dlog.get(), nullptr);
      const auto got_dl = gpu_test::to_float(dlog.download());
      double worst = 0, most = 0;
      for (std::size_t i = 0; i < want_dl.size(); ++i) {
        worst = std::max(worst, double(std::abs(got_dl[i] - want_dl[i])));
        most = std::max(most, double(std::abs(want_dl[i])));
      }
      EXPECT_GE(gpu_test::cosine(got_dl, want_dl), 0.99999) << what;
      EXPECT_LE(worst, 1e-2 * most) << what;
    }
}

// ---- the sort and the grouped GEMMs ----

// idx over E experts with experts `empty` never chosen and the rest in uneven shares.
std::vector<int> uneven_choices(std::mt19937& rng, int slots, int experts, const std::vector<int>& empty) {
  std::vector<int> pool;
  for (int e = 0; e < experts; ++e)
    if (std::find(empty.begin(), empty.end(), e) == empty.end())
      for (int r = 0; r <= e * e; ++r) pool.push_back(e);  // expert e weighted 1 + e^2
  std::vector<int> out(static_cast<std::size_t>(slots));
  for (auto& v : out) v = pool[rng() % pool.size()];
  return out;
}

TEST(CudaMoePermute, SortsSlotsStablyByExpert) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  const int experts = 6;
  for (int slots : {1, 31, 256, 3001}) {
    const auto idx = uneven_choices(rng, slots, experts, {0, 3});
    std::vector<int> order(static_cast<std::size_t>(slots));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return idx[a] < idx[b]; });
    std::vector<int> where(static_cast<std::size_t>(slots)), offsets(experts + 1, 0);
    for (int r = 0; r < slots; ++r) where[static_cast<std::size_t>(order[r])] = r;
    for (int v : idx) ++offsets[v + 1];
    for (int e = 0; e < experts; ++e) offsets[e + 1] += offsets[e];
    DeviceVec<int> d_idx(idx), d_where(where.size()), d_order(order.size()), d_off(offsets.size());
    DeviceVec<int> scratch(static_cast<std::size_t>(cuda::moe_sort_scratch_ints(slots, experts)));
    cuda::moe_sort_by_expert(d_idx.get(), slots, experts, scratch.get(), d_off.get(), d_where.get(), d_order.get(),
                             nullptr);
    EXPECT_EQ(d_off.download(), offsets) << slots;
    EXPECT_EQ(d_order.download(), order) << slots;
    EXPECT_EQ(d_where.download(), where) << slots;
  }
}

// The permutation's row copies, from both sides: moe_gather (a row per sorted slot, as expert parallelism's k = 1
// permutations use it) and moe_expand (a token's row to its k rows) give the same bits, rows of one 16-byte vector,
// of a part of a warp's stretch, and of more than one stretch.
TEST(CudaMoePermute, GatherAndExpandCopyEveryTokensRows) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  struct Shape {
    int tokens, k, d;
  };
  for (const Shape s : {Shape{1, 1, 8}, Shape{37, 4, 264}, Shape{9, 3, 2056}, Shape{19, 8, 4096}}) {
    const int rows = s.tokens * s.k;
    std::vector<int> order(static_cast<std::size_t>(rows)), where(order.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int r = 0; r < rows; ++r) where[static_cast<std::size_t>(order[r])] = r;
    std::vector<float> src;
    DeviceVec<bf16> d_src(gpu_test::random_bf16(static_cast<std::size_t>(s.tokens) * s.d, rng, 1.0f, src));
    DeviceVec<int> d_order(order), d_where(where);
    DeviceVec<bf16> gathered(static_cast<std::size_t>(rows) * s.d), expanded(static_cast<std::size_t>(rows) * s.d);
    cuda::moe_gather(d_src.get(), d_order.get(), rows, s.k, s.d, gathered.get(), nullptr);
    cuda::moe_expand(d_src.get(), d_where.get(), s.tokens, s.k, s.d, expanded.get(), nullptr);
    const auto g = gathered.download(), x = expanded.download();
    std::size_t wrong_g = 0, wrong_x = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < s.d; ++c) {
        const float want = src[static_cast<std::size_t>(order[r] / s.k) * s.d + c];
        const std::size_t at = static_cast<std::size_t>(r) * s.d + c;
        wrong_g += __bfloat162float(g[at]) != want;
        wrong_x += __bfloat162float(x[at]) != want;
      }
    EXPECT_EQ(wrong_g, 0u) << s.tokens << " x " << s.k << " x " << s.d;
    EXPECT_EQ(wrong_x, 0u) << s.tokens << " x " << s.k << " x " << s.d;
  }
}

// The experts' SwiGLU backward (moe_swiglu_backward) against a host double reference, on widths of one 8-wide vector,
// of part of a block's threads and of several vectors a thread: dgu within bf16 rounding, dw (the routing weight's
// gradient, each slot's from its sorted row) within float summation error.
TEST(CudaMoePermute, SwigluBackwardMatchesHost) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  for (const int ffn : {8, 1000, 1024, 4104}) {
    const int rows = 37;
    std::vector<int> order(static_cast<std::size_t>(rows));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<float> gu, dact, w(static_cast<std::size_t>(rows));
    std::uniform_real_distribution<float> wd(0.1f, 1.0f);
    for (auto& v : w) v = wd(rng);
    DeviceVec<bf16> d_gu(gpu_test::random_bf16(static_cast<std::size_t>(rows) * 2 * ffn, rng, 1.0f, gu));
    DeviceVec<bf16> d_dact(gpu_test::random_bf16(static_cast<std::size_t>(rows) * ffn, rng, 1.0f, dact));
    DeviceVec<float> d_w(w), d_dw(w.size());
    DeviceVec<int> d_order(order);
    DeviceVec<bf16> d_dgu(static_cast<std::size_t>(rows) * 2 * ffn);
    cuda::moe_swiglu_backward(d_dact.get(), d_gu.get(), d_w.get(), d_order.get(), rows, ffn, d_dgu.get(), d_dw.get(),
                              nullptr);
    const auto dgu = d_dgu.download();
    const auto dw = d_dw.download();
    double worst_dgu = 0, worst_dw = 0;
    for (int r = 0; r < rows; ++r) {
      const double c = w[static_cast<std::size_t>(order[r])];
      double dot = 0, scale = 0;
      for (int j = 0; j < ffn; ++j) {
        const std::size_t at = static_cast<std::size_t>(r) * 2 * ffn + j;
        const double g = gu[at], u = gu[at + ffn], d = dact[static_cast<std::size_t>(r) * ffn + j];
        const double sg = 1.0 / (1.0 + std::exp(-g)), silu = g * sg;
        dot += d * silu * u, scale += std::abs(d * silu * u);
        const double dg = c * d * u * sg * (1.0 + g * (1.0 - sg)), du = c * d * silu;
        worst_dgu = std::max({worst_dgu, std::abs(__bfloat162float(dgu[at]) - dg) / (std::abs(dg) + 1e-2),
                              std::abs(__bfloat162float(dgu[at + ffn]) - du) / (std::abs(du) + 1e-2)});
      }
      worst_dw = std::max(worst_dw, std::abs(dw[static_cast<std::size_t>(order[r])] - dot) / (scale + 1e-6));
    }
    EXPECT_LT(worst_dgu, 1e-2) << ffn;
    EXPECT_LT(worst_dw, 1e-5) << ffn;
  }
}

// The three grouped GEMM forms over experts with uneven and empty row counts (grouped_gemm.h), their arrays planned
// on the device from the offsets, against double sums of the same bf16 values: per expert e, rows [off[e], off[e+1]),
//   kNT  Y_e = X_e W_e^T   [r, N],   kNN  Z_e = D_e W_e   [r, K],   kTNAccumulate  G_e += D_e^T X_e   [N, K] fp32,
// with X [rows, K], D [rows, N], W [E, N, K]. An empty expert's G keeps its sentinel; with beta 0 G_e is written
// over, and moe_clear_empty_experts zeroes the empty experts'. Sizes cross the 128 x 256
// tiles and K is no multiple of the 64-deep k tile. Then the same plan and GEMM captured once in a CUDA graph and
// replayed on other counts: the counts are read on the device.
struct GroupedCase {
  int K = 200, N = 264;
  std::vector<float> x, w, dy;
  DeviceVec<bf16> dx, dw, ddy;
  GroupedCase(int max_rows, int experts, std::mt19937& rng)
      : dx(gpu_test::random_bf16(static_cast<std::size_t>(max_rows) * K, rng, 1.0f, x)),
        dw(gpu_test::random_bf16(static_cast<std::size_t>(experts) * N * K, rng, 0.1f, w)),
        ddy(gpu_test::random_bf16(static_cast<std::size_t>(max_rows) * N, rng, 1.0f, dy)) {}
  std::size_t xi(int r, int i) const { return static_cast<std::size_t>(r) * K + i; }
  std::size_t di(int r, int j) const { return static_cast<std::size_t>(r) * N + j; }
  std::size_t wi(int e, int j, int i) const { return (static_cast<std::size_t>(e) * N + j) * K + i; }
};

std::vector<int> offsets_of(const std::vector<int>& counts) {
  std::vector<int> off(counts.size() + 1, 0);
  for (std::size_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

TEST(CudaMoeGroupedGemm, UnevenAndEmptyExpertsMatchReference) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  cuda::GroupedGemm gemm;
  if (!gemm.available()) GTEST_SKIP() << "no CUTLASS Hopper grouped GEMM in this build or on this GPU";
  const std::vector<int> counts = {0, 5, 64, 0, 131, 1, 300};
  const int E = static_cast<int>(counts.size());
  const std::vector<int> off = offsets_of(counts);
  const int rows = off[E];
  std::mt19937 rng(3);
  GroupedCase t(rows, E, rng);
  const int K = t.K, N = t.N;
  const float sentinel = 0.25f;
  DeviceVec<bf16> y(static_cast<std::size_t>(rows) * N), z(static_cast<std::size_t>(rows) * K);
  DeviceVec<float> g(std::vector<float>(static_cast<std::size_t>(E) * N * K, sentinel));
  DeviceVec<int> d_off(off);
  DeviceVec<char> arrays(3 * cuda::grouped_args_bytes(E));
  const auto out = [&](int i) { return cuda::grouped_args_at(arrays.get() + i * cuda::grouped_args_bytes(E), E); };
  const auto rows_of = [](const void* base, int ld) { return cuda::GroupedOperand{base, ld, 0, ld, 2}; };
  const auto expert = [&](const void* base, int ld, int bytes) {
    return cuda::GroupedOperand{base, 0, static_cast<std::int64_t>(N) * K, ld, bytes};
  };
  const cuda::GroupedPlan plans[3] = {
      {rows_of(t.dx.get(), K), expert(t.dw.get(), K, 2), rows_of(y.get(), N), 0, N, K, out(0)},   // kNT
      {rows_of(t.ddy.get(), N), expert(t.dw.get(), K, 2), rows_of(z.get(), K), 0, K, N, out(1)},  // kNN
      {rows_of(t.ddy.get(), N), rows_of(t.dx.get(), K), expert(g.get(), K, 4), N, K, 0, out(2)},  // kTNAccumulate
  };
  cuda::grouped_plan(plans, 3, d_off.get(), E, nullptr);
  gemm.run(cuda::GroupedForm::kNT, E, plans[0].out, nullptr);
  gemm.run(cuda::GroupedForm::kNN, E, plans[1].out, nullptr);
  gemm.run(cuda::GroupedForm::kTNAccumulate, E, plans[2].out, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<double> want_y(static_cast<std::size_t>(rows) * N), want_z(static_cast<std::size_t>(rows) * K),
      want_g(static_cast<std::size_t>(E) * N * K, sentinel);
  for (int e = 0; e < E; ++e)
    for (int r = off[e]; r < off[e + 1]; ++r)
      for (int j = 0; j < N; ++j) {
        double s = 0;
        for (int i = 0; i < K; ++i) {
          s += double(t.x[t.xi(r, i)]) * t.w[t.wi(e, j, i)];
          want_z[t.xi(r, i)] += double(t.dy[t.di(r, j)]) * t.w[t.wi(e, j, i)];
          want_g[t.wi(e, j, i)] += double(t.dy[t.di(r, j)]) * t.x[t.xi(r, i)];
        }
        want_y[t.di(r, j)] = s;
      }
  EXPECT_LT(gpu_test::rel_error(gpu_test::to_float(y.download()), want_y), 1e-2);
  EXPECT_LT(gpu_test::rel_error(gpu_test::to_float(z.download()), want_z), 1e-2);
  const auto got_g = g.download();
  EXPECT_LT(gpu_test::rel_error(got_g, want_g), 1e-3);
  for (int e : {0, 3})
    for (int j = 0; j < N; ++j)
      for (int i = 0; i < K; ++i) ASSERT_EQ(got_g[t.wi(e, j, i)], sentinel) << "expert " << e;
  // With beta 0 the weight gradient is written over (the first micro-batch after zero_grad), and the empty experts'
  // slices, which the GEMM skips, are cleared after it.
  g.upload(std::vector<float>(static_cast<std::size_t>(E) * N * K, sentinel));
  gemm.run(cuda::GroupedForm::kTNAccumulate, E, plans[2].out, nullptr, 0.0f);
  cuda::moe_clear_empty_experts(g.get(), d_off.get(), E, static_cast<std::int64_t>(N) * K, nullptr);
  std::vector<double> want_over(want_g);
  for (int e = 0; e < E; ++e)
    for (int j = 0; j < N; ++j)
      for (int i = 0; i < K; ++i) want_over[t.wi(e, j, i)] -= sentinel;
  const auto got_over = g.download();
  EXPECT_LT(gpu_test::rel_error(got_over, want_over), 1e-3);
  for (int e : {0, 3})
    for (int j = 0; j < N; ++j)
      for (int i = 0; i < K; ++i) ASSERT_EQ(got_over[t.wi(e, j, i)], 0.0f) << "expert " << e << ", beta 0";

  // One graph of the plan and the forward GEMM, replayed after the offsets change on the device.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cuda::grouped_plan(plans, 1, d_off.get(), E, stream);
  gemm.run(cuda::GroupedForm::kNT, E, plans[0].out, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  const std::vector<int> others[] = {{300, 0, 0, 201, 0, 0, 0}, {1, 2, 3, 4, 5, 6, 7}};
  for (const std::vector<int>& other : others) {
    const std::vector<int> o = offsets_of(other);
    d_off.upload(o);
    y.upload(std::vector<bf16>(static_cast<std::size_t>(rows) * N, __float2bfloat16(0.0f)));
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<double> want(static_cast<std::size_t>(rows) * N, 0.0);
    for (int e = 0; e < E; ++e)
      for (int r = o[e]; r < o[e + 1]; ++r)
        for (int j = 0; j < N; ++j) {
          double s = 0;
          for (int i = 0; i < K; ++i) s += double(t.x[t.xi(r, i)]) * t.w[t.wi(e, j, i)];
          want[t.di(r, j)] = s;
        }
    EXPECT_LT(gpu_test::rel_error(gpu_test::to_float(y.download()), want), 1e-2) << "replay, " << o[E] << " rows";
  }
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(stream);
}

// ---- whole models ----

ckpt::ModelConfig moe_config(ckpt::MoeScoreFunction score, std::vector<int> pattern) {
  auto c = gpu_test::small_config();
  c.num_experts = 8, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 64;
  c.moe_router_score_function = score;
  c.moe_layer_pattern = std::move(pattern);
  c.moe_aux_loss_coeff = 0.01, c.moe_z_loss_coeff = 0.001;
  return c;
}

// Token t's embedding row carries +1 at column t % E and +0.5 at another column; each router row e reads column e
// with weight 1: the top-2 experts of a token have logits about 10 and 5 after the norm, far apart from the rest.
void spike_router(Model& model, const ckpt::ModelConfig& c) {
  const int E = c.num_experts, d = c.hidden_size;
  auto emb = model.export_parameter("embedding.word_embeddings.weight");
  for (std::int64_t t = 0; t < c.padded_vocab_size(); ++t) {
    const int first = static_cast<int>(t % E), second = (first + 1 + static_cast<int>(t / E) % (E - 1)) % E;
    emb[static_cast<std::size_t>(t * d + first)] += 1.0f;
    emb[static_cast<std::size_t>(t * d + second)] += 0.5f;
  }
  model.import_parameter("embedding.word_embeddings.weight", emb);
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::string name = "decoder.layers." + std::to_string(l) + ".mlp.router.weight";
    auto r = model.export_parameter(name);
    for (int e = 0; e < E; ++e) r[static_cast<std::size_t>(e * d + e)] += 1.0f;
    model.import_parameter(name, r);
  }
}

struct MoePair {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  Model model;
  CudaModel gpu;
  MoePair(const ckpt::ModelConfig& c, const CudaOptions& options) : model(c, *cpu), gpu(c, CudaShard{}, options) {
    model.init(11);
    spike_router(model, c);
    for (const auto& p : model.parameters()) gpu.import_parameter(p.spec.name, model.export_parameter(p.spec.name));
  }
};

struct MoeBatch {
  std::int64_t batch = 3, seq = 40;
  gpu_test::MaskedColumns cols;
  std::vector<std::int32_t> positions;
  CudaBatch view(bool causal) const {
    return {batch, seq, causal, cols.ids, cols.labels, positions, cols.weights, 0.5};
  }
};
MoeBatch moe_batch(std::uint32_t seed) {
  MoeBatch b;
  std::mt19937 rng(seed);
  b.cols = gpu_test::masked_columns(rng, b.batch * b.seq, 0, 499, 499, 1.0f / 60);
  for (std::int64_t r = 0; r < b.batch; ++r)
    for (std::int64_t j = 0; j < b.seq; ++j) b.positions.push_back(static_cast<std::int32_t>(j));
  return b;
}

// Returns the slots the CPU's experts kept, summed over the layers.
std::int64_t check_moe_model(const ckpt::ModelConfig& c, bool causal, const std::string& what,
                             const CudaOptions& options = {}) {
  MoePair pair(c, options);
  const MoeBatch mb = moe_batch(17);
  const CudaBatch b = mb.view(causal);
  // Logits of every row first (a forward only), then one training step on each side.
  const ModelInput in{b.batch, b.seq, b.ids, b.positions, {}, causal ? AttentionKind::kCausal : AttentionKind::kBidirectional, {}};
  const auto cpu_logits = pair.cpu->host_f32(pair.model.forward(in));
  const auto gpu_logits = pair.gpu.forward_logits(b.batch, b.seq, causal, b.ids, b.positions);
  const std::int64_t V = c.vocab_size, P = c.padded_vocab_size();
  double worst_logits = 0;
  for (std::int64_t r = 0; r < b.batch * b.seq; ++r) {
    std::vector<float> g(gpu_logits.begin() + r * V, gpu_logits.begin() + (r + 1) * V);
    std::vector<double> w(cpu_logits.begin() + r * P, cpu_logits.begin() + r * P + V);
    worst_logits = std::max(worst_logits, gpu_test::rel_error(g, w));
  }
  EXPECT_LT(worst_logits, 2e-2) << what;

  pair.model.forward(in);
  const auto ce = pair.model.cross_entropy(b.labels);
  double want = 0;
  for (std::size_t i = 0; i < ce.size(); ++i) want += double{b.weights[i]} * ce[i];
  pair.model.backward(b.weights, b.router_loss_weight);
  const double got = pair.gpu.forward_backward(b);
  EXPECT_NEAR(got, want, 1e-2 * std::abs(want)) << what;

  const auto stats = pair.model.moe_stats();
  const auto counts = pair.gpu.moe_tokens_per_expert();
  if (counts.size() != stats.size()) {
    ADD_FAILURE() << what << ": " << counts.size() << " MoE layers on the GPU, " << stats.size() << " on the CPU";
    return 0;
  }
  std::int64_t kept = 0;
  for (std::size_t l = 0; l < stats.size(); ++l) {
    EXPECT_EQ(counts[l], stats[l].tokens_per_expert) << what << " layer " << l;
    for (auto n : stats[l].tokens_per_expert) kept += n;
  }

  std::string worst_name;
  const double worst = gpu_test::expect_gradients_match(pair.model, pair.gpu, what, worst_name);
  std::printf("[moe parity] %s: loss cpu %.6f gpu %.6f, logits worst row %.5f, worst cosine %.6f (%s)\n", what.c_str(),
              want, got, worst_logits, worst, worst_name.c_str());
  return kept;
}

TEST(CudaMoeParity, SoftmaxRouterEveryLayer) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = moe_config(ckpt::MoeScoreFunction::kSoftmax, {});
  check_moe_model(c, false, "softmax, every layer MoE, diffusion");
  check_moe_model(c, true, "softmax, every layer MoE, causal");
  check_moe_model(c, false, "softmax, deterministic", gpu_test::deterministic_options());
}

TEST(CudaMoeParity, SigmoidRouterAndMixedLayers) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  // The last layer MoE (the head's packed-rows MLP is off), then the last layer dense after an MoE one.
  check_moe_model(moe_config(ckpt::MoeScoreFunction::kSigmoid, {0, 1}), false, "sigmoid, layers dense + MoE");
  auto plain = moe_config(ckpt::MoeScoreFunction::kSoftmax, {1, 0});
  plain.moe_norm_topk_prob = false;
  check_moe_model(plain, false, "softmax without normalisation, layers MoE + dense");
}

// A shared expert (a dense SwiGLU of width 48 beside the routed ones) on every MoE layer, without recomputation and
// with it (the rerun computes the shared expert's activations too).
TEST(CudaMoeParity, SharedExpert) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  auto c = moe_config(ckpt::MoeScoreFunction::kSoftmax, {});
  c.moe_shared_expert_intermediate_size = 48;
  check_moe_model(c, false, "softmax, shared expert");
  c.moe_layer_pattern = {0, 1};
  check_moe_model(c, true, "softmax, shared expert, layers dense + MoE, causal");
}

// Full recomputation reruns the routing (and a capacity factor's drop) before each MoE layer's backward: the same
// gradients, bit for bit.
TEST(CudaMoeParity, RecomputationGivesTheSameGradients) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  auto c = moe_config(ckpt::MoeScoreFunction::kSoftmax, {});
  c.moe_shared_expert_intermediate_size = 48;
  for (const double factor : {0.0, 0.6}) {  // dropless, and the rerun's drop the same
    c.moe_expert_capacity_factor = factor;
    auto plain = gpu_test::deterministic_model(c, 3), again = gpu_test::deterministic_model(c, 3);
    again->set_recompute_layers(true);
    const MoeBatch mb = moe_batch(23);
    EXPECT_EQ(plain->forward_backward(mb.view(false)), again->forward_backward(mb.view(false))) << factor;
    for (const auto& t : plain->tensors())
      EXPECT_EQ(plain->export_gradient(t.name), again->export_gradient(t.name)) << t.name << ", factor " << factor;
  }
}

// The samplers' forward of an MoE model runs as a CUDA graph after a shape's first call (the experts' counts stay on
// the device): the graphed model gives the eager model's greedy tokens and confidences bit for bit on calls eager
// (the first), captured (the second) and replayed, each call on other ids, so other experts' row counts.
TEST(CudaMoeModel, GraphedSamplingForwardMatchesEager) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  auto c = moe_config(ckpt::MoeScoreFunction::kSoftmax, {});
  c.moe_shared_expert_intermediate_size = 48;
  CudaOptions graphed = gpu_test::deterministic_options(), eager = graphed;
  eager.cuda_graphs = false;
  const auto a = gpu_test::model_with(c, graphed, 9), e = gpu_test::model_with(c, eager, 9);
  const std::int64_t batch = 2, seq = 32;
  std::mt19937 rng(8);
  std::vector<std::int32_t> tokens_a, tokens_e;
  std::vector<float> confidence_a, confidence_e;
  for (int call = 0; call < 4; ++call) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(batch * seq));
    for (auto& id : ids) id = static_cast<std::int32_t>(rng() % 500);
    a->greedy_tokens(batch, seq, false, ids, {}, tokens_a, confidence_a);
    e->greedy_tokens(batch, seq, false, ids, {}, tokens_e, confidence_e);
    EXPECT_EQ(tokens_a, tokens_e) << "call " << call;
    EXPECT_EQ(confidence_a, confidence_e) << "call " << call;
    EXPECT_EQ(a->moe_tokens_per_expert(), e->moe_tokens_per_expert()) << "call " << call;
  }
}

// A capacity factor on every MoE layer (the position policy: the earliest tokens, decided by the routing alone, which
// the spiked router makes the CPU's): the GPU keeps the slots the CPU keeps (the tokens each expert kept, equal) and
// follows its logits, loss and gradients; with a shared expert too. Some slots are dropped.
TEST(CudaMoeParity, CapacityFactorDropsAsTheCpu) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  auto c = moe_config(ckpt::MoeScoreFunction::kSoftmax, {});
  c.moe_expert_capacity_factor = 0.6;
  c.moe_token_drop_policy = ckpt::MoeDropPolicy::kPosition;
  const std::int64_t routed = static_cast<std::int64_t>(c.num_layers) * 3 * 40 * c.moe_router_topk;  // moe_batch's
  EXPECT_LT(check_moe_model(c, false, "softmax, capacity factor 0.6, position"), routed);
  c.moe_shared_expert_intermediate_size = 48;
  EXPECT_LT(check_moe_model(c, true, "softmax, capacity factor 0.6, position, shared expert, causal"), routed);
}

}  // namespace
}  // namespace dlm::train
