// FP8's pieces at the training step's shapes, each beside what it replaces: per linear layer of the 350M and the
// MegaDLMs 1.7B (tokens = micro-batch x 2048), the forward, data-gradient and weight-gradient GEMMs in bf16
// (Gemm::run, tuned) and in FP8 (Gemm::run_fp8: e4m3 x e4m3 forward with fast accumulation, e5m2 x e4m3 backward),
// TFLOP/s and the ratio; then the casts' bandwidth (bytes read + written per second): amax, the row-major cast, the
// transposed cast (both layouts, the backward's dy; beside it fp8_cast_variants.cu's other tilings), RMSNorm's
// forward with and without its fused cast, the gradients' producers (RMSNorm and SwiGLU backward; SwiGLU forward)
// with and without their fused amax, and SwiGLU straight into FP8 against SwiGLU then the casts (delayed and
// tensorwise).
// `window`: the samplers' window step (dlm-generate --fp8) at the 1.7B shape, piece by piece, each replayed as a CUDA
// graph (as the samplers replay a step) over kCopies copies of the weights (so they come from memory, as a step's
// layers do): per linear, the bf16 GEMM beside the FP8 GEMM (both tuned: skinny shapes, gemm.h), us a call and the
// weight's GB/s; then a layer's producers of the GEMM inputs as the bf16 step runs them (RMSNorm, SwiGLU) beside
// FP8's (the producer with its amax, then the cast; the attention output's amax pass, then the cast); per layer, the
// sums.
// usage: fp8_bench [REPS=20] | fp8_bench window [ROWS=32] [REPS=20]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/fp8_cast.h"
#include "backend/cuda/gemm.h"
#include "fp8_cast_variants.h"
#include "kernel_bench.h"

namespace {

namespace cuda = dlm::train::cuda;
using cuda::bf16;
using cuda::fp8;

struct Linear {
  const char* name;
  int n, k;  // W [n, k]
};
struct Model {
  const char* name;
  int tokens, hidden;
  std::vector<Linear> linears;
};

std::vector<fp8> download(const fp8* device, std::size_t n) {
  std::vector<fp8> host(n);
  cuda::check_cuda(cudaMemcpy(host.data(), device, n, cudaMemcpyDeviceToHost), "download");
  return host;
}

double tflops(int m, int n, int k, double ms) { return 2.0 * m * n * k / (ms * 1e-3) / 1e12; }

void time_linears(cuda::Gemm& gemm, const Model& model, cuda::Fp8Slot* slots, int reps) {
  const int T = model.tokens;
  for (const Linear& l : model.linears) {
    const std::size_t xs = std::size_t(T) * l.k, ws = std::size_t(l.n) * l.k, ys = std::size_t(T) * l.n;
    bf16 *x = dlm::bench::device_alloc<bf16>(xs), *w = dlm::bench::device_alloc<bf16>(ws);
    bf16 *y = dlm::bench::device_alloc<bf16>(ys), *dx = dlm::bench::device_alloc<bf16>(xs);
    float* dw = dlm::bench::device_alloc<float>(ws);
    fp8 *x8 = dlm::bench::device_alloc<fp8>(xs), *w8 = dlm::bench::device_alloc<fp8>(ws),
        *wt8 = dlm::bench::device_alloc<fp8>(ws), *dy8 = dlm::bench::device_alloc<fp8>(ys),
        *dyt8 = dlm::bench::device_alloc<fp8>(ys), *xt8 = dlm::bench::device_alloc<fp8>(xs);
    dlm::bench::fill_random(x, xs), dlm::bench::fill_random(w, ws, 3), dlm::bench::fill_random(y, ys, 5);
    const cuda::Fp8Cast e4m3{slots, false, false, 1.0f}, e5m2{slots + 1, true, false, 1.0f};
    cuda::fp8_quantize(x, T, l.k, e4m3, x8, xt8, nullptr);
    cuda::fp8_quantize(w, l.n, l.k, e4m3, w8, wt8, nullptr);
    cuda::fp8_quantize(y, T, l.n, e5m2, dy8, dyt8, nullptr);
    const float* si = &slots[0].scale_inv;
    const float* gi = &slots[1].scale_inv;
    const double bf_fwd = dlm::bench::time_ms(
        [&] { gemm.run(false, true, T, l.n, l.k, x, l.k, w, l.k, y, false, l.n, 0.0f, nullptr); }, reps);
    const double bf_dx = dlm::bench::time_ms(
        [&] { gemm.run(false, false, T, l.k, l.n, y, l.n, w, l.k, dx, false, l.k, 0.0f, nullptr); }, reps);
    const double bf_dw = dlm::bench::time_ms(
        [&] { gemm.run(true, false, l.n, l.k, T, y, l.n, x, l.k, dw, true, l.k, 0.0f, nullptr); }, reps);
    const double f8_fwd = dlm::bench::time_ms(
        [&] { gemm.run_fp8(T, l.n, l.k, {x8, l.k, false, si}, {w8, l.k, false, si}, y, false, l.n, 0.0f, true, nullptr); },
        reps);
    const double f8_dx = dlm::bench::time_ms(
        [&] { gemm.run_fp8(T, l.k, l.n, {dy8, l.n, true, gi}, {wt8, l.n, false, si}, dx, false, l.k, 0.0f, false, nullptr); },
        reps);
    const double f8_dw = dlm::bench::time_ms(
        [&] { gemm.run_fp8(l.n, l.k, T, {dyt8, T, true, gi}, {xt8, T, false, si}, dw, true, l.k, 0.0f, false, nullptr); },
        reps);
    cuda::check_cuda(cudaGetLastError(), "GEMMs");
    std::printf("%-13s %-5s %6d x %6d x %6d  TFLOP/s bf16 / FP8: forward %4.0f / %4.0f (%.2fx)  dX %4.0f / %4.0f "
                "(%.2fx)  dW %4.0f / %4.0f (%.2fx)\n",
                model.name, l.name, T, l.n, l.k, tflops(T, l.n, l.k, bf_fwd), tflops(T, l.n, l.k, f8_fwd),
                bf_fwd / f8_fwd, tflops(T, l.k, l.n, bf_dx), tflops(T, l.k, l.n, f8_dx), bf_dx / f8_dx,
                tflops(l.n, l.k, T, bf_dw), tflops(l.n, l.k, T, f8_dw), bf_dw / f8_dw);
    // The casts of dy (the widest): bytes moved per second.
    const double n = static_cast<double>(ys);
    const double amax = dlm::bench::time_ms([&] { cuda::fp8_amax(y, static_cast<std::int64_t>(ys), slots + 1, nullptr); }, reps);
    const double rows = dlm::bench::time_ms([&] { cuda::fp8_quantize(y, T, l.n, e5m2, dy8, nullptr, nullptr); }, reps);
    const double both = dlm::bench::time_ms([&] { cuda::fp8_quantize(y, T, l.n, e5m2, dy8, dyt8, nullptr); }, reps);
    // The transposed cast's other kernels (fp8_cast_variants.cu), and whether they write the library's bytes.
    const std::vector<fp8> lib = download(dy8, ys), lib_t = download(dyt8, ys);
    const double tiles128x64 = dlm::bench::time_ms(
        [&] { cuda::fp8_quantize_tiled_128x64(y, T, l.n, e5m2, dy8, dyt8, nullptr); }, reps);
    bool same = download(dy8, ys) == lib && download(dyt8, ys) == lib_t;
    const double looping =
        dlm::bench::time_ms([&] { cuda::fp8_quantize_tiled_looping(y, T, l.n, e5m2, dy8, dyt8, nullptr); }, reps);
    same = same && download(dy8, ys) == lib && download(dyt8, ys) == lib_t;
    const double blocks16 =
        dlm::bench::time_ms([&] { cuda::fp8_quantize_blocks16(y, T, l.n, e5m2, dy8, dyt8, nullptr); }, reps);
    same = same && download(dy8, ys) == lib && download(dyt8, ys) == lib_t;
    std::printf("%-13s %-5s casts of dy [%d, %d]: amax %.0f GB/s, row-major %.0f GB/s, row-major + transposed %.0f GB/s "
                "(%.3f ms; 128 x 64 tiles %.0f, looping %.0f, 16 x 16 register blocks %.0f GB/s, %s bytes)\n",
                model.name, l.name, T, l.n, 2 * n / amax / 1e6, 3 * n / rows / 1e6, 4 * n / both / 1e6, both,
                4 * n / tiles128x64 / 1e6, 4 * n / looping / 1e6, 4 * n / blocks16 / 1e6, same ? "same" : "DIFFERENT");
    for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(y), static_cast<void*>(dx),
                    static_cast<void*>(dw), static_cast<void*>(x8), static_cast<void*>(w8), static_cast<void*>(wt8),
                    static_cast<void*>(dy8), static_cast<void*>(dyt8), static_cast<void*>(xt8)})
      cudaFree(p);
  }
  // RMSNorm's forward alone and with the fused cast (delayed: the FP8 copy written too).
  const std::size_t hs = std::size_t(T) * model.hidden;
  bf16 *h = dlm::bench::device_alloc<bf16>(hs), *out = dlm::bench::device_alloc<bf16>(hs);
  fp8* q = dlm::bench::device_alloc<fp8>(hs);
  float *nw = dlm::bench::device_alloc<float>(model.hidden), *rstd = dlm::bench::device_alloc<float>(T);
  dlm::bench::fill_random(h, hs);
  const std::vector<float> ones(static_cast<std::size_t>(model.hidden), 1.0f);
  cuda::check_cuda(cudaMemcpy(nw, ones.data(), sizeof(float) * ones.size(), cudaMemcpyHostToDevice), "norm weight");
  const cuda::Fp8Out fused{q, slots, false};
  const double plain = dlm::bench::time_ms(
      [&] { cuda::rmsnorm_forward(h, nullptr, nullptr, nw, out, rstd, T, model.hidden, 1e-6f, nullptr); }, reps);
  const double cast = dlm::bench::time_ms(
      [&] { cuda::rmsnorm_forward(h, nullptr, nullptr, nw, out, rstd, T, model.hidden, 1e-6f, nullptr, &fused); }, reps);
  std::printf("%-13s rmsnorm fwd [%d, %d]: %.3f ms, with the fused FP8 cast %.3f ms\n", model.name, T, model.hidden,
              plain, cast);
  // The gradients' producers alone and with the fused amax (tensorwise): RMSNorm's backward, SwiGLU's forward and
  // backward (ffn: fc2's input width).
  const int ffn = model.linears.back().k;
  const std::size_t gs = std::size_t(T) * ffn;
  bf16 *dres = dlm::bench::device_alloc<bf16>(hs), *gu = dlm::bench::device_alloc<bf16>(2 * gs),
       *act = dlm::bench::device_alloc<bf16>(gs), *dgu = dlm::bench::device_alloc<bf16>(2 * gs);
  float *ndw = dlm::bench::device_alloc<float>(model.hidden),
        *partial = dlm::bench::device_alloc<float>(cuda::rmsnorm_partial_floats(T, model.hidden));
  dlm::bench::fill_random(dres, hs, 7), dlm::bench::fill_random(gu, 2 * gs, 9), dlm::bench::fill_random(act, gs, 11);
  const cuda::Fp8Out amax_only{nullptr, slots, false};
  auto norm_bwd = [&](cuda::Fp8Slot* amax) {
    return dlm::bench::time_ms([&] {
      cuda::rmsnorm_backward(h, out, nw, rstd, dres, true, ndw, partial, T, model.hidden, nullptr, amax);
    }, reps);
  };
  const double nb = norm_bwd(nullptr), nba = norm_bwd(slots);
  const double sf = dlm::bench::time_ms([&] { cuda::swiglu_forward(gu, act, T, ffn, nullptr); }, reps);
  const double sfa = dlm::bench::time_ms([&] { cuda::swiglu_forward(gu, act, T, ffn, nullptr, &amax_only); }, reps);
  const double sb = dlm::bench::time_ms([&] { cuda::swiglu_backward(act, gu, dgu, T, ffn, nullptr); }, reps);
  const double sba = dlm::bench::time_ms([&] { cuda::swiglu_backward(act, gu, dgu, T, ffn, nullptr, slots); }, reps);
  std::printf("%-13s with the fused amax: rmsnorm bwd [%d, %d] %.3f / %.3f ms, swiglu fwd [%d, %d] %.3f / %.3f ms, "
              "swiglu bwd %.3f / %.3f ms\n",
              model.name, T, model.hidden, nb, nba, T, ffn, sf, sfa, sb, sba);
  // Delayed: SwiGLU's backward into bf16 then the cast in both layouts, against the backward straight into FP8.
  fp8 *g8 = dlm::bench::device_alloc<fp8>(2 * gs), *gt8 = dlm::bench::device_alloc<fp8>(2 * gs);
  const cuda::Fp8Cast e5m2{slots + 1, true, false, 1.0f};
  const double two = dlm::bench::time_ms([&] {
    cuda::swiglu_backward(act, gu, dgu, T, ffn, nullptr);
    cuda::fp8_quantize(dgu, T, 2 * ffn, e5m2, g8, gt8, nullptr);
  }, reps);
  const double one = dlm::bench::time_ms([&] { cuda::swiglu_backward_fp8(act, gu, T, ffn, e5m2, g8, gt8, nullptr); }, reps);
  // Bytes moved: the backward reads dh and gu (6 bytes an element of h) and writes dgu (4 in bf16, 2 + 2 in FP8's
  // two layouts); the separate cast reads the bf16 dgu back (4) and writes both layouts (4).
  const double g = static_cast<double>(gs);
  std::printf("%-13s swiglu bwd [%d, %d] + cast (both layouts) %.3f ms (%.0f GB/s), straight into FP8 %.3f ms "
              "(%.0f GB/s)\n",
              model.name, T, ffn, two, 18 * g / two / 1e6, one, 10 * g / one / 1e6);
  // Delayed, fc2's input: SwiGLU's forward with its fused row-major cast, then the backward's transposed cast of h,
  // against the forward straight into FP8 in both layouts.
  const cuda::Fp8Out fused_h{g8, slots, false};
  const cuda::Fp8Cast e4m3{slots, false, false, 1.0f};
  const double fwd_two = dlm::bench::time_ms([&] {
    cuda::swiglu_forward(gu, act, T, ffn, nullptr, &fused_h);
    cuda::fp8_quantize(act, T, ffn, e4m3, nullptr, gt8, nullptr);
  }, reps);
  const double fwd_one = dlm::bench::time_ms([&] { cuda::swiglu_forward_fp8(gu, T, ffn, e4m3, g8, gt8, nullptr); }, reps);
  // The forward reads gu (4) and writes h (2 in bf16 + 1 in FP8, or 1 + 1 in FP8's two layouts); the transposed
  // cast reads h back (2) and writes 1.
  std::printf("%-13s swiglu fwd [%d, %d] with its cast + the transposed cast %.3f ms (%.0f GB/s), straight into FP8 "
              "%.3f ms (%.0f GB/s)\n",
              model.name, T, ffn, fwd_two, 10 * g / fwd_two / 1e6, fwd_one, 6 * g / fwd_one / 1e6);
  // Tensorwise, where the amax must come first: SwiGLU into bf16 with its amax then the cast(s), against an amax
  // pass that writes nothing then straight into FP8 with the scale it gives.
  const cuda::Fp8Cast cur5{slots + 1, true, true, 1.0f}, cur4{slots, false, true, 1.0f};
  const cuda::Fp8Out amax_h{nullptr, slots, false};
  const double tw_bwd_old = dlm::bench::time_ms([&] {
    cuda::swiglu_backward(act, gu, dgu, T, ffn, nullptr, slots + 1);
    cuda::fp8_quantize(dgu, T, 2 * ffn, cur5, g8, gt8, nullptr);
  }, reps);
  const double tw_bwd_new = dlm::bench::time_ms([&] {
    cuda::swiglu_backward_amax(act, gu, T, ffn, slots + 1, nullptr);
    cuda::swiglu_backward_fp8(act, gu, T, ffn, cur5, g8, gt8, nullptr);
  }, reps);
  const double tw_fwd_old = dlm::bench::time_ms([&] {
    cuda::swiglu_forward(gu, act, T, ffn, nullptr, &amax_h);
    cuda::fp8_quantize(act, T, ffn, cur4, g8, nullptr, nullptr);
    cuda::fp8_quantize(act, T, ffn, e4m3, nullptr, gt8, nullptr);
  }, reps);
  const double tw_fwd_new = dlm::bench::time_ms([&] {
    cuda::swiglu_forward_amax(gu, T, ffn, slots, nullptr);
    cuda::swiglu_forward_fp8(gu, T, ffn, cur4, g8, gt8, nullptr);
  }, reps);
  std::printf("%-13s tensorwise swiglu bwd: bf16 + amax, cast %.3f ms; amax pass, straight into FP8 %.3f ms | "
              "fwd: bf16 + amax, cast, transposed cast %.3f ms; amax pass, straight into FP8 %.3f ms\n",
              model.name, tw_bwd_old, tw_bwd_new, tw_fwd_old, tw_fwd_new);
  cudaFree(g8), cudaFree(gt8);
  for (void* p : {static_cast<void*>(h), static_cast<void*>(out), static_cast<void*>(q), static_cast<void*>(nw),
                  static_cast<void*>(rstd), static_cast<void*>(dres), static_cast<void*>(gu), static_cast<void*>(act),
                  static_cast<void*>(dgu), static_cast<void*>(ndw), static_cast<void*>(partial)})
    cudaFree(p);
}

// Microseconds per call of f(i, stream), i in [0, calls), replayed `reps` times as one captured CUDA graph after an
// eager run (per-shape choices, GEMM tuning) and one untimed replay.
template <typename F>
double graph_us(F&& f, int calls, int reps) {
  cudaStream_t st = nullptr;
  cuda::check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  for (int i = 0; i < calls; ++i) f(i, st);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda::check_cuda(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < calls; ++i) f(i, st);
  cuda::check_cuda(cudaStreamEndCapture(st, &graph), "capture");
  cuda::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const double ms = dlm::bench::time_ms([&] { cuda::check_cuda(cudaGraphLaunch(exec, st), "replay"); }, reps, st);
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(st);
  return 1e3 * ms / calls;
}

void time_window(int rows, int reps) {
  constexpr int kCopies = 8, kCalls = 32;  // kCopies x a linear's weights: 0.2-0.8 GB of bf16, beyond L2
  const int d = 2048, ffn = 6144;
  const std::vector<Linear> linears = {{"qkv", 6144, 2048}, {"proj", 2048, 2048}, {"fc1", 12288, 2048}, {"fc2", 2048, 6144}};
  // Slot 0: the weights' (scale 1: uniform operands), slot 1: the inputs' (tensorwise: written by each cast).
  const std::vector<cuda::Fp8Slot> init(2, {.scale_inv = 1, .amax = 0, .scale = 1, .fp8_max = 448});
  cuda::Fp8Slot* slots = dlm::bench::device_alloc<cuda::Fp8Slot>(init.size());
  cuda::check_cuda(cudaMemcpy(slots, init.data(), sizeof(cuda::Fp8Slot) * init.size(), cudaMemcpyHostToDevice), "slots");
  cuda::Gemm gemm(true);
  double gemm_bf16 = 0, gemm_fp8 = 0;
  for (const Linear& l : linears) {
    const std::size_t ws = std::size_t(l.n) * l.k, xs = std::size_t(rows) * l.k;
    bf16 *w = dlm::bench::device_alloc<bf16>(ws * kCopies), *x = dlm::bench::device_alloc<bf16>(xs),
         *y = dlm::bench::device_alloc<bf16>(std::size_t(rows) * l.n);
    fp8 *w8 = dlm::bench::device_alloc<fp8>(ws * kCopies), *x8 = dlm::bench::device_alloc<fp8>(xs);
    dlm::bench::fill_random(w, ws), dlm::bench::fill_random(x, xs, 3);
    for (int c = 1; c < kCopies; ++c)
      cuda::check_cuda(cudaMemcpy(w + c * ws, w, ws * 2, cudaMemcpyDeviceToDevice), "weight copies");
    cuda::fp8_quantize(w, l.n, l.k, {slots, false, false, 1.0f}, w8, nullptr, nullptr);
    for (int c = 1; c < kCopies; ++c)
      cuda::check_cuda(cudaMemcpy(w8 + c * ws, w8, ws, cudaMemcpyDeviceToDevice), "weight copies");
    cuda::fp8_quantize(x, rows, l.k, {slots + 1, false, false, 1.0f}, x8, nullptr, nullptr);
    cuda::check_cuda(cudaDeviceSynchronize(), "setup");  // the graphs run on a stream of their own
    const float* si = &slots[0].scale_inv;
    const double bf = graph_us([&](int i, cudaStream_t st) {
      gemm.run(false, true, rows, l.n, l.k, x, l.k, w + (i % kCopies) * ws, l.k, y, false, l.n, 0.0f, st);
    }, kCalls, reps);
    const double f8 = graph_us([&](int i, cudaStream_t st) {
      gemm.run_fp8(rows, l.n, l.k, {x8, l.k, false, si}, {w8 + (i % kCopies) * ws, l.k, false, si}, y, false, l.n,
                   0.0f, true, st);
    }, kCalls, reps);
    gemm_bf16 += bf, gemm_fp8 += f8;
    std::printf("window %-5s %4d x %5d x %5d  bf16 %6.1f us (%4.0f GB/s)  FP8 %6.1f us (%4.0f GB/s)  %.2fx\n", l.name,
                rows, l.n, l.k, bf, 2.0 * ws / bf / 1e3, f8, 1.0 * ws / f8 / 1e3, bf / f8);
    for (void* p : {static_cast<void*>(w), static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(w8),
                    static_cast<void*>(x8)})
      cudaFree(p);
  }
  // A layer's producers of the GEMM inputs, as the step runs them: RMSNorm with the residual add (twice a layer),
  // SwiGLU, and for FP8 the attention output's cast.
  const std::size_t hs = std::size_t(rows) * d, gs = std::size_t(rows) * ffn;
  bf16 *res = dlm::bench::device_alloc<bf16>(hs), *add = dlm::bench::device_alloc<bf16>(hs),
       *sum = dlm::bench::device_alloc<bf16>(hs), *h = dlm::bench::device_alloc<bf16>(hs),
       *gu = dlm::bench::device_alloc<bf16>(2 * gs), *act = dlm::bench::device_alloc<bf16>(gs);
  fp8* q = dlm::bench::device_alloc<fp8>(gs);
  float *nw = dlm::bench::device_alloc<float>(d), *rstd = dlm::bench::device_alloc<float>(rows);
  dlm::bench::fill_random(res, hs), dlm::bench::fill_random(add, hs, 5), dlm::bench::fill_random(gu, 2 * gs, 7);
  const std::vector<float> ones(static_cast<std::size_t>(d), 1.0f);
  cuda::check_cuda(cudaMemcpy(nw, ones.data(), sizeof(float) * ones.size(), cudaMemcpyHostToDevice), "norm weight");
  cuda::check_cuda(cudaDeviceSynchronize(), "setup");
  cuda::Fp8Slot* in = slots + 1;
  const cuda::Fp8Cast cur{in, false, true, 1.0f};
  const cuda::Fp8Out amax_only{nullptr, in, false};
  const auto norm = [&](const cuda::Fp8Out* f8, cudaStream_t st) {
    cuda::rmsnorm_forward(res, add, sum, nw, h, rstd, rows, d, 1e-6f, st, f8);
  };
  const double norm_bf16 = graph_us([&](int, cudaStream_t st) { norm(nullptr, st); }, kCalls, reps);
  const double norm_apart = graph_us([&](int, cudaStream_t st) {
    norm(&amax_only, st);
    cuda::fp8_quantize(h, rows, d, cur, q, nullptr, st);
  }, kCalls, reps);
  const double att_apart = graph_us([&](int, cudaStream_t st) {
    cuda::fp8_amax(h, static_cast<std::int64_t>(hs), in, st);
    cuda::fp8_quantize(h, rows, d, cur, q, nullptr, st);
  }, kCalls, reps);
  const double swiglu_bf16 = graph_us([&](int, cudaStream_t st) { cuda::swiglu_forward(gu, act, rows, ffn, st); },
                                      kCalls, reps);
  const double swiglu_apart = graph_us([&](int, cudaStream_t st) {
    cuda::swiglu_forward(gu, act, rows, ffn, st, &amax_only);
    cuda::fp8_quantize(act, rows, ffn, cur, q, nullptr, st);
  }, kCalls, reps);
  std::printf("window producers, us a call: rmsnorm [%d, %d] bf16 %.1f, with the FP8 cast %.1f | attention output's "
              "FP8 cast %.1f | swiglu [%d, %d] bf16 %.1f, with the FP8 cast %.1f\n",
              rows, d, norm_bf16, norm_apart, att_apart, rows, ffn, swiglu_bf16, swiglu_apart);
  const double bf16_layer = gemm_bf16 + 2 * norm_bf16 + swiglu_bf16,
               fp8_layer = gemm_fp8 + 2 * norm_apart + att_apart + swiglu_apart;
  std::printf("window per layer (GEMMs + these producers), us: bf16 %.1f, FP8 %.1f (%.2fx)\n", bf16_layer, fp8_layer,
              bf16_layer / fp8_layer);
  for (void* p : {static_cast<void*>(res), static_cast<void*>(add), static_cast<void*>(sum), static_cast<void*>(h),
                  static_cast<void*>(gu), static_cast<void*>(act), static_cast<void*>(q), static_cast<void*>(nw),
                  static_cast<void*>(rstd), static_cast<void*>(slots)})
    cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "window") {
    try {
      time_window(argc > 2 ? std::atoi(argv[2]) : 32, argc > 3 ? std::atoi(argv[3]) : 20);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fp8_bench: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  try {
    // Slot 0 e4m3, slot 1 e5m2, both at scale 1 (the operands are uniform in [-0.5, 0.5)).
    const std::vector<cuda::Fp8Slot> init = {{.scale_inv = 1, .amax = 0, .scale = 1, .fp8_max = 448},
                                                  {.scale_inv = 1, .amax = 0, .scale = 1, .fp8_max = 57344}};
    cuda::Fp8Slot* slots = dlm::bench::device_alloc<cuda::Fp8Slot>(init.size());
    cuda::check_cuda(cudaMemcpy(slots, init.data(), sizeof(cuda::Fp8Slot) * init.size(), cudaMemcpyHostToDevice), "slots");
    cuda::Gemm gemm(true);
    // 350M: d 1024, 16/8 heads of 64, ffn 2816, micro-batch 8. MegaDLMs 1.7B: d 2048, 16 heads of 128 (MHA), ffn 6144,
    // micro-batch 4.
    const std::vector<Model> models = {
        {"350m", 8 * 2048, 1024, {{"qkv", 2048, 1024}, {"proj", 1024, 1024}, {"fc1", 5632, 1024}, {"fc2", 1024, 2816}}},
        {"megadlm-1.7b", 4 * 2048, 2048,
         {{"qkv", 6144, 2048}, {"proj", 2048, 2048}, {"fc1", 12288, 2048}, {"fc2", 2048, 6144}}}};
    for (const auto& m : models) time_linears(gemm, m, slots, reps);
    cudaFree(slots);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
