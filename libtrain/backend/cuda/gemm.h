// cuBLASLt GEMMs in row-major terms: bf16 operands, fp32 accumulation, bf16 or fp32 output.
//   C[M, N] = alpha * op(A) op(B) + beta * C,  op(A) [M, K], op(B) [K, N]
// Row-major C is column-major C^T = op(B)^T op(A)^T, so B's memory is cuBLASLt's first operand. Algorithms
// come from cuBLASLt's heuristic once per shape and are cached. Tuned (the default): a shape of at least
// kTuneFlops is timed, at its first call that overwrites C (beta 0) outside a graph capture, with each of the
// heuristic's first kTuneCandidates algorithms on that call's own operands (C is about to be overwritten), and
// the fastest is kept, because the heuristic's first is not the fastest at some of the training step's shapes
// (benchmarks/train/gemm_bench times them). Timing picks by the clock, so a run may pick another algorithm than
// the last (rounding differs); untuned (CudaOptions::deterministic) keeps the heuristic's first.
// Skinny shapes (bf16 or FP8, fewer than kTuneFlops but operands of at least kTuneElements: a few rows over a large
// weight, as the samplers' window steps and greedy head run) are tuned too: they are bound by reading the weight,
// which the heuristic's first choice often does with too few thread blocks; the rule counts elements, not bytes,
// because the thread blocks a shape can fill depend on its tiles, and an FP8 weight has the bf16 one's tiles in half
// the bytes. Their candidates are the heuristic's first kSkinnyCandidates and split-K variants (kSplits) of its first
// kSplitBases (32 rows over a 2048-wide output are 16 tiles of 128 columns: split-K is what fills the GPU), each
// timed from a cold L2 (the workspace is overwritten before every timed call), because in a forward each layer's
// weight comes from memory.
// FP8 (run_fp8): e4m3 or e5m2 operands (not both e5m2) with per-tensor dequantization scales, fp32 accumulation,
// bf16 or fp32 output. Hopper's FP8 kernels take only the "TN" form, in row-major terms C = A B^T with both
// operands K-contiguous, and 16-byte-aligned leading dimensions and n, k: fp8_gemm_fits says which shapes qualify (m,
// the rows of A and C, is not a leading dimension: any count, as PyTorch's _scaled_mm allows).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "kernels.h"

namespace dlm::train::cuda {

class Gemm {
 public:
  explicit Gemm(bool tune = true);
  ~Gemm();
  static constexpr double kTuneFlops = 1e10;
  static constexpr int kTuneCandidates = 8;
  static constexpr double kTuneElements = 4.0 * (1 << 20);  // 8 MiB of bf16
  static constexpr int kSkinnyCandidates = 16, kSplitBases = 4;
  static constexpr int kSplits[] = {2, 4, 8, 16};
  bool tunes() const { return tune_; }
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // A GEMM one of whose sizes is a packed row count that changes from call to call (the output layer on the
  // loss rows): `dim` names it (m or k), `rows` is its largest value. The algorithm is chosen once, for that
  // largest shape, and reused at every count that cuBLASLt accepts it for (checked once per count), so that
  // new counts neither query the heuristic nor load new kernels.
  struct RowFamily {
    enum Dim { kM, kK } dim;
    int rows;
  };
  // c_f32 false: C is bf16; true: C is fp32 (weight gradients: beta 1 accumulates across micro-batches).
  void run(bool trans_a, bool trans_b, int m, int n, int k, const bf16* a, int lda, const bf16* b, int ldb, void* c,
           bool c_f32, int ldc, float beta, cudaStream_t stream, const RowFamily* family = nullptr);
  // The same GEMM with each of the heuristic's first `count` algorithms (the first is run()'s): milliseconds
  // per call over `repeats` calls after one warm-up, -1 where an algorithm refuses the problem. C is written
  // (beta 1 adds repeats + 1 times). For benchmarks/train/gemm_bench.
  std::vector<double> time_candidates(bool trans_a, bool trans_b, int m, int n, int k, const bf16* a, int lda,
                                      const bf16* b, int ldb, void* c, bool c_f32, int ldc, float beta, int count,
                                      int repeats, cudaStream_t stream);

  // One FP8 operand: its values (row-major, K contiguous), format and dequantization scale (device pointer to one
  // float, the Fp8Slot's scale_inv: read when the GEMM runs, so a cast enqueued before it may write it).
  struct Fp8Operand {
    const void* data;
    int ld;
    bool e5m2;
    const float* scale_inv;
  };
  // C[m, n] = (a.scale_inv * b.scale_inv) A[m, k] B[n, k]^T + beta C, tuned as run() is. fast_accum: Hopper's
  // faster FP8 accumulation (partial sums kept at lower precision: Transformer Engine's choice for the forward;
  // the backward's GEMMs take the full one).
  void run_fp8(int m, int n, int k, const Fp8Operand& a, const Fp8Operand& b, void* c, bool c_f32, int ldc, float beta,
               bool fast_accum, cudaStream_t stream);
  // Whether cuBLASLt's FP8 GEMM takes the shape on Hopper: n, k and the leading dimensions multiples of 16 (m any).
  static bool fp8_gemm_fits(int m, int n, int k, int lda, int ldb, int ldc);

 private:
  // A GEMM's shape: trans_a, trans_b, m, n, k, lda, ldb, ldc, c_f32, the operands' types (cudaDataType of A and
  // of B) and FP8's fast accumulation (fields named by the enum).
  using Key = std::tuple<bool, bool, int, int, int, int, int, int, bool, int, int, bool>;
  enum KeyField { kKeyTransA, kKeyTransB, kKeyM, kKeyN, kKeyK, kKeyLda, kKeyLdb, kKeyLdc, kKeyF32, kKeyTypeA,
                  kKeyTypeB, kKeyFastAccum };
  struct Descriptors;
  std::vector<cublasLtMatmulAlgo_t> heuristic(const Descriptors& g, int count);
  // The heuristic's first algorithm for the shape, asked once (or the tuned one).
  const cublasLtMatmulAlgo_t& cached(const Key& key);
  // Whether run()'s rule tunes `key` (the header's comment), and whether as a skinny shape.
  static bool tuned_shape(const Key& key);
  static bool skinny(const Key& key);
  // The skinny shape's candidates: the heuristic's, then split-K variants that cuBLASLt accepts for the shape.
  std::vector<cublasLtMatmulAlgo_t> skinny_candidates(const Descriptors& g);
  // Times the candidates for `key` on the call's operands and caches the fastest.
  void tune(const Descriptors& g, const Key& key, const void* a, const void* b, void* c, cudaStream_t stream);
  // The tuning rule (see the header's comment) and the call, shared by run() and run_fp8().
  void launch(const Descriptors& g, const Key& key, const void* a, const void* b, void* c, float beta,
              cudaStream_t stream, const RowFamily* family);
  // Milliseconds per call of each algorithm over `repeats` calls after one warm-up; -1 where one refuses. cold: the
  // workspace is overwritten before each call (L2 then holds no operand) and only the calls are timed.
  std::vector<double> time_algorithms(const Descriptors& g, const std::vector<cublasLtMatmulAlgo_t>& algos,
                                      const void* a, const void* b, void* c, float beta, int repeats,
                                      cudaStream_t stream, bool cold = false);
  // run()'s algorithm: the shape's own, or its family's where cuBLASLt accepts that for the shape.
  const cublasLtMatmulAlgo_t& algo_for(const Descriptors& g, const Key& key, const RowFamily* family);
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = std::size_t{64} << 20;
  std::map<Key, cublasLtMatmulAlgo_t> algos_;
  std::set<Key> tuned_;  // shapes timed already
  bool tune_ = true;
  std::map<std::pair<Key, Key>, bool> family_fits_;  // (family key, exact key): cuBLASLt accepts the algorithm
};

}  // namespace dlm::train::cuda
