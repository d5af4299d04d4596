// CPU backend: memory, copies, elementwise ops and the thread pool the op files share.
#include "cpu_backend.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/common/log.h"

namespace dlm::train::cpu {

namespace {

// 64-byte aligned host memory (whole cache lines, AVX-512 loads).
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(std::size_t bytes) : bytes_(bytes) {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    data_ = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    if (rounded && !data_) fail(fmt::format("cpu backend: cannot allocate {} bytes", bytes));
  }
  ~HostBuffer() override { std::free(data_); }
  void* data() override { return data_; }
  std::size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

void expect_dtype(const Tensor& t, DType dtype) {
  if (!t.defined()) fail("cpu backend: an undefined tensor was passed to an op");
  if (t.dtype() != dtype)
    fail(fmt::format("cpu backend: tensor of dtype {} where {} was expected", dtype_name(t.dtype()), dtype_name(dtype)));
}

}  // namespace

float* f32(const Tensor& t) {
  expect_dtype(t, DType::kF32);
  return static_cast<float*>(t.data());
}
const std::int32_t* i32(const Tensor& t) {
  expect_dtype(t, DType::kI32);
  return static_cast<const std::int32_t*>(t.data());
}
const std::uint8_t* u8(const Tensor& t) {
  expect_dtype(t, DType::kU8);
  return static_cast<const std::uint8_t*>(t.data());
}

void expect_numel(const char* op, const char* name, const Tensor& t, std::int64_t numel) {
  if (!t.defined() || t.numel() != numel)
    fail(fmt::format("cpu backend: {}: {} has {} elements, expected {}", op, name, t.defined() ? t.numel() : 0, numel));
}

// OpenBLAS picks its kernels from the CPUID model at load time; on CPUs it does not know (many VMs
// report a generic "Intel Xeon Processor") 0.3.21 falls back to SSE3 kernels, 2x slower than AVX2.
static void warn_on_slow_blas_kernels() {
  static bool warned = false;
  const std::string_view core = openblas_get_corename();
  const bool old_core = core == "Prescott" || core == "Core2" || core == "Nehalem" || core == "Penryn" || core == "Dunnington";
  if (!warned && old_core && __builtin_cpu_supports("avx2")) {
    warned = true;
    log::warning("OpenBLAS chose its {} kernels on this AVX2 CPU: set OPENBLAS_CORETYPE=Haswell (or SkylakeX with "
                 "AVX-512) for about 2x faster CPU training",
                 core);
  }
}

CpuBackend::CpuBackend(int threads) : pool_(threads > 0 ? static_cast<std::size_t>(threads) : 0) {
  warn_on_slow_blas_kernels();
}

void CpuBackend::parallel_for(std::int64_t n, std::int64_t grain,
                              const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (n <= 0) return;
  if (pool_.size() <= 1 || n <= grain) {
    body(0, n);
    return;
  }
  pool_.parallel_for(static_cast<std::size_t>(n), [&](std::size_t b, std::size_t e) {
    body(static_cast<std::int64_t>(b), static_cast<std::int64_t>(e));
  });
}

void CpuBackend::parallel_blas_for(std::int64_t n, std::int64_t grain,
                                  const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (pool_.size() <= 1 || n <= grain) {
    body(0, n);
    return;
  }
  const int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  try {
    parallel_for(n, grain, body);
  } catch (...) {
    openblas_set_num_threads(blas_threads);
    throw;
  }
  openblas_set_num_threads(blas_threads);
}

Tensor CpuBackend::alloc(std::vector<std::int64_t> shape, DType dtype) {
  if (dtype == DType::kBF16) fail("cpu backend: bf16 storage is not supported (the CPU backend is fp32)");
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 0) fail(fmt::format("cpu backend: negative dimension {}", d));
    n *= d;
  }
  auto buffer = std::make_shared<HostBuffer>(static_cast<std::size_t>(n) * dtype_size(dtype));
  return Tensor(std::move(buffer), std::move(shape), dtype);
}

template <typename T>
static void copy_in(const Tensor& dst, std::span<const T> src, DType dtype) {
  expect_dtype(dst, dtype);
  expect_numel("copy_from_host", "destination", dst, static_cast<std::int64_t>(src.size()));
  if (!src.empty()) std::memcpy(dst.data(), src.data(), src.size_bytes());
}

void CpuBackend::copy_from_host(const Tensor& dst, std::span<const float> src) { copy_in(dst, src, DType::kF32); }
void CpuBackend::copy_from_host(const Tensor& dst, std::span<const std::int32_t> src) { copy_in(dst, src, DType::kI32); }
void CpuBackend::copy_from_host(const Tensor& dst, std::span<const std::uint8_t> src) { copy_in(dst, src, DType::kU8); }

void CpuBackend::copy_to_host(const Tensor& src, std::span<float> dst) {
  expect_numel("copy_to_host", "source", src, static_cast<std::int64_t>(dst.size()));
  if (!dst.empty()) std::memcpy(dst.data(), f32(src), dst.size_bytes());
}

std::span<float> CpuBackend::host_f32(const Tensor& t) {
  return {f32(t), static_cast<std::size_t>(t.numel())};
}

void CpuBackend::zero(const Tensor& t) {
  if (!t.defined()) fail("cpu backend: zero of an undefined tensor");
  if (t.bytes()) std::memset(t.data(), 0, t.bytes());
}

void CpuBackend::add(const Tensor& y, const Tensor& x) {
  expect_numel("add", "x", x, y.numel());
  float* py = f32(y);
  const float* px = f32(x);
  parallel_for(y.numel(), 1 << 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) py[i] += px[i];
  });
}

void CpuBackend::copy(const Tensor& dst, const Tensor& src) {
  expect_dtype(dst, src.dtype());
  expect_numel("copy", "source", src, dst.numel());
  if (dst.bytes()) std::memcpy(dst.data(), src.data(), dst.bytes());
}

}  // namespace dlm::train::cpu

namespace dlm::train {

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<cpu::CpuBackend>(threads); }

}  // namespace dlm::train
