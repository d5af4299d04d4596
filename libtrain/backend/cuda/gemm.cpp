#include "gemm.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train::cuda {
namespace {

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(fmt::format("cuBLASLt: {}: status {}", what, static_cast<int>(status)));
}

}  // namespace

// One GEMM's cuBLASLt descriptors, destroyed with it.
struct Gemm::Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  explicit Descriptors(const Key& key) {
    const bool trans_a = std::get<kKeyTransA>(key), trans_b = std::get<kKeyTransB>(key), c_f32 = std::get<kKeyF32>(key);
    const int m = std::get<kKeyM>(key), n = std::get<kKeyN>(key), k = std::get<kKeyK>(key);
    const auto type_a = static_cast<cudaDataType_t>(std::get<kKeyTypeA>(key)),
               type_b = static_cast<cudaDataType_t>(std::get<kKeyTypeB>(key));
    check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
    const cublasOperation_t first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &first, sizeof(first));
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &second, sizeof(second));
    if (type_a != CUDA_R_16BF) {
      const std::int8_t fast = std::get<kKeyFastAccum>(key) ? 1 : 0;
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
    }
    // Column-major views: B's memory is [n x k] (or [k x n] transposed), A's is [k x m] (or [m x k]).
    check_lt(cublasLtMatrixLayoutCreate(&la, type_b, trans_b ? k : n, trans_b ? n : k, std::get<kKeyLdb>(key)),
             "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&lb, type_a, trans_a ? m : k, trans_a ? k : m, std::get<kKeyLda>(key)),
             "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&lc, c_f32 ? CUDA_R_32F : CUDA_R_16BF, n, m, std::get<kKeyLdc>(key)),
             "layout C");
  }
  // The FP8 operands' dequantization scales (cuBLASLt's A is the row-major B).
  void scales(const float* a_scale_inv, const float* b_scale_inv) {
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof(b_scale_inv));
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof(a_scale_inv));
  }
  ~Descriptors() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
};

namespace {

constexpr int kBf16 = CUDA_R_16BF;

int fp8_type(bool e5m2) { return e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

}  // namespace

Gemm::Gemm(bool tune) : tune_(tune) {
  check_lt(cublasLtCreate(&handle_), "create");
  check_cuda(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc (GEMM workspace)");
}

Gemm::~Gemm() {
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

std::vector<cublasLtMatmulAlgo_t> Gemm::heuristic(const Descriptors& g, int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                       sizeof(workspace_bytes_));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(count));
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, g.op, g.la, g.lb, g.lc, g.lc, pref, count, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check_lt(status, "heuristic");
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i) algos.push_back(results[static_cast<std::size_t>(i)].algo);
  return algos;
}

const cublasLtMatmulAlgo_t& Gemm::cached(const Key& key) {
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    const auto found = heuristic(Descriptors(key), 1);
    if (found.empty())
      fail(fmt::format("cuBLASLt: no algorithm for {}x{}x{}", std::get<kKeyM>(key), std::get<kKeyN>(key), std::get<kKeyK>(key)));
    it = algos_.emplace(key, found.front()).first;
  }
  return it->second;
}

const cublasLtMatmulAlgo_t& Gemm::algo_for(const Descriptors& g, const Key& key, const RowFamily* family) {
  if (!family) return cached(key);
  // The family's entry is keyed like its largest GEMM's own (a call at the largest count shares it).
  Key largest = key;
  (family->dim == RowFamily::kM ? std::get<kKeyM>(largest) : std::get<kKeyK>(largest)) = family->rows;
  const cublasLtMatmulAlgo_t& algo = cached(largest);
  auto fit = family_fits_.find({largest, key});
  if (fit == family_fits_.end()) {
    cublasLtMatmulHeuristicResult_t result{};
    const bool ok = cublasLtMatmulAlgoCheck(handle_, g.op, g.la, g.lb, g.lc, g.lc, &algo, &result) ==
                        CUBLAS_STATUS_SUCCESS &&
                    result.workspaceSize <= workspace_bytes_;
    fit = family_fits_.emplace(std::make_pair(largest, key), ok).first;
  }
  return fit->second ? algo : cached(key);
}

bool Gemm::skinny(const Key& key) {
  const double m = std::get<kKeyM>(key), n = std::get<kKeyN>(key), k = std::get<kKeyK>(key);
  return 2.0 * m * n * k < kTuneFlops && m * k + n * k >= kTuneElements;
}

bool Gemm::tuned_shape(const Key& key) {
  const double flops = 2.0 * std::get<kKeyM>(key) * std::get<kKeyN>(key) * std::get<kKeyK>(key);
  return flops >= kTuneFlops || skinny(key);
}

std::vector<cublasLtMatmulAlgo_t> Gemm::skinny_candidates(const Descriptors& g) {
  auto algos = heuristic(g, kSkinnyCandidates);
  const std::size_t bases = std::min<std::size_t>(algos.size(), kSplitBases);
  for (std::size_t i = 0; i < bases; ++i) {
    const cublasLtMatmulAlgo_t base = algos[i];
    int supported = 0;
    std::size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &supported, sizeof(supported),
                                          &written) != CUBLAS_STATUS_SUCCESS ||
        !supported)
      continue;
    for (const int splits : kSplits) {
      cublasLtMatmulAlgo_t algo = base;
      const auto parts = static_cast<std::uint32_t>(splits);
      // The partial sums reduced in fp32 in the workspace, then rounded once.
      const std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      cublasLtMatmulHeuristicResult_t result{};
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &parts, sizeof(parts)) ==
              CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                               sizeof(scheme)) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulAlgoCheck(handle_, g.op, g.la, g.lb, g.lc, g.lc, &algo, &result) == CUBLAS_STATUS_SUCCESS &&
          result.workspaceSize <= workspace_bytes_)
        algos.push_back(algo);
    }
  }
  return algos;
}

void Gemm::tune(const Descriptors& g, const Key& key, const void* a, const void* b, void* c, cudaStream_t stream) {
  tuned_.insert(key);
  const bool cold = skinny(key);
  const auto algos = cold ? skinny_candidates(g) : heuristic(g, kTuneCandidates);
  if (algos.size() < 2) return;
  const auto ms = time_algorithms(g, algos, a, b, c, 0.0f, cold ? 10 : 3, stream, cold);
  std::size_t best = 0;
  for (std::size_t i = 1; i < ms.size(); ++i)
    if (ms[i] > 0 && (ms[best] <= 0 || ms[i] < ms[best])) best = i;
  if (ms[best] <= 0) return;
  algos_.insert_or_assign(key, algos[best]);
  // A row family led by this shape checks its counts against the new algorithm afresh.
  for (auto it = family_fits_.begin(); it != family_fits_.end();)
    it = it->first.first == key ? family_fits_.erase(it) : std::next(it);
}

void Gemm::run(bool trans_a, bool trans_b, int m, int n, int k, const bf16* a, int lda, const bf16* b, int ldb,
               void* c, bool c_f32, int ldc, float beta, cudaStream_t stream, const RowFamily* family) {
  // beta is not part of the key: the heuristic does not see it, and a gradient GEMM must run the same algorithm
  // whether it overwrites (the first micro-batch after zero_grad) or adds.
  const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldc, c_f32, kBf16, kBf16, false};
  launch(Descriptors(key), key, a, b, c, beta, stream, family);
}

bool Gemm::fp8_gemm_fits(int m, int n, int k, int lda, int ldb, int ldc) {
  return m > 0 && n % 16 == 0 && k % 16 == 0 && lda % 16 == 0 && ldb % 16 == 0 && ldc % 16 == 0;
}

void Gemm::run_fp8(int m, int n, int k, const Fp8Operand& a, const Fp8Operand& b, void* c, bool c_f32, int ldc,
                   float beta, bool fast_accum, cudaStream_t stream) {
  if (!fp8_gemm_fits(m, n, k, a.ld, b.ld, ldc))
    fail(fmt::format("FP8 GEMM: {}x{}x{} (lda {}, ldb {}, ldc {}): n, k and the leading dimensions must be multiples "
                     "of 16", m, n, k, a.ld, b.ld, ldc));
  if (a.e5m2 && b.e5m2) fail("FP8 GEMM: e5m2 x e5m2 has no cuBLASLt kernel (one operand must be e4m3)");
  if (reinterpret_cast<std::uintptr_t>(a.scale_inv) % 16 != 0 || reinterpret_cast<std::uintptr_t>(b.scale_inv) % 16 != 0)
    fail("FP8 GEMM: a scale pointer is not 16-byte aligned (cuBLASLt refuses it)");
  const Key key{false, true, m, n, k, a.ld, b.ld, ldc, c_f32, fp8_type(a.e5m2), fp8_type(b.e5m2), fast_accum};
  Descriptors g(key);
  g.scales(a.scale_inv, b.scale_inv);
  launch(g, key, a.data, b.data, c, beta, stream, nullptr);
}

void Gemm::launch(const Descriptors& g, const Key& key, const void* a, const void* b, void* c, float beta,
                  cudaStream_t stream, const RowFamily* family) {
  // Tuning times the call's own GEMM into C, which only a beta-0 call may do; the head's row families keep the
  // heuristic's choice (their largest shape is not this call's).
  if (tune_ && !family && beta == 0.0f && tuned_shape(key) && !tuned_.count(key)) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream, &capture), "capture status");
    if (capture == cudaStreamCaptureStatusNone) tune(g, key, a, b, c, stream);
  }
  const cublasLtMatmulAlgo_t& algo = algo_for(g, key, family);
  const float alpha = 1.0f;
  check_lt(cublasLtMatmul(handle_, g.op, &alpha, b, g.la, a, g.lb, &beta, c, g.lc, c, g.lc, &algo, workspace_,
                          workspace_bytes_, stream),
           "matmul");
}

std::vector<double> Gemm::time_candidates(bool trans_a, bool trans_b, int m, int n, int k, const bf16* a, int lda,
                                          const bf16* b, int ldb, void* c, bool c_f32, int ldc, float beta, int count,
                                          int repeats, cudaStream_t stream) {
  const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldc, c_f32, kBf16, kBf16, false};
  const Descriptors g(key);
  return time_algorithms(g, heuristic(g, count), a, b, c, beta, repeats, stream);
}

std::vector<double> Gemm::time_algorithms(const Descriptors& g, const std::vector<cublasLtMatmulAlgo_t>& algos,
                                          const void* a, const void* b, void* c, float beta, int repeats,
                                          cudaStream_t stream, bool cold) {
  std::vector<double> ms;
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "event"), check_cuda(cudaEventCreate(&stop), "event");
  const float alpha = 1.0f;
  for (const auto& algo : algos) {
    auto once = [&] {
      return cublasLtMatmul(handle_, g.op, &alpha, b, g.la, a, g.lb, &beta, c, g.lc, c, g.lc, &algo, workspace_,
                            workspace_bytes_, stream);
    };
    if (once() != CUBLAS_STATUS_SUCCESS) {
      ms.push_back(-1);
      continue;
    }
    double total = 0;
    // Cold: each call timed alone after the workspace (larger than L2) is overwritten; else the calls back to back.
    for (int r = 0; r < (cold ? repeats : 1); ++r) {
      if (cold) check_cuda(cudaMemsetAsync(workspace_, r & 0xff, workspace_bytes_, stream), "L2 flush");
      check_cuda(cudaEventRecord(start, stream), "event");
      for (int i = 0; i < (cold ? 1 : repeats); ++i) check_lt(once(), "matmul");
      check_cuda(cudaEventRecord(stop, stream), "event");
      check_cuda(cudaEventSynchronize(stop), "event");
      float t = 0;
      check_cuda(cudaEventElapsedTime(&t, start, stop), "event");
      total += static_cast<double>(t);
    }
    ms.push_back(total / repeats);
  }
  cudaEventDestroy(start), cudaEventDestroy(stop);
  return ms;
}

}  // namespace dlm::train::cuda
