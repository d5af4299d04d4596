// grouped_plan (grouped_gemm.h): every grouped GEMM's per-group arrays from the experts' row offsets, on the device,
// so no count reaches the host. A thread per (plan, expert).
#include "common.cuh"
#include "grouped_gemm.h"

namespace dlm::train::cuda {
namespace {

struct Plans {
  GroupedPlan p[kMaxGroupedPlans];
};

__device__ const void* address(const GroupedOperand& o, std::int64_t first, int e) {
  return static_cast<const char*>(o.base) + (first * o.per_row + e * o.per_expert) * o.element_bytes;
}

__global__ void plan_k(Plans plans, int count, const int* offsets, int groups) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count * groups) return;
  const GroupedPlan& p = plans.p[i / groups];
  const int e = i % groups, first = offsets[e], rows = offsets[e + 1] - first;
  int* shape = p.out.shapes + 3 * e;
  shape[0] = rows == 0 ? 0 : p.m ? p.m : rows;
  shape[1] = rows == 0 ? 0 : p.n;
  shape[2] = rows == 0 ? 0 : p.k ? p.k : rows;
  p.out.a[e] = address(p.a, first, e), p.out.b[e] = address(p.b, first, e);
  p.out.c[e] = const_cast<void*>(address(p.c, first, e));
  p.out.lda[e] = p.a.ld, p.out.ldb[e] = p.b.ld, p.out.ldc[e] = p.c.ld;
}

}  // namespace

std::size_t grouped_args_bytes(int groups) {
  const auto g = static_cast<std::size_t>(groups);
  const auto round = [](std::size_t b) { return (b + 15) / 16 * 16; };
  return round(3 * sizeof(int) * g) + 3 * round(sizeof(void*) * g) + 3 * round(sizeof(std::int64_t) * g);
}

GroupedArgs grouped_args_at(void* base, int groups) {
  const auto g = static_cast<std::size_t>(groups);
  auto* at = static_cast<char*>(base);
  const auto take = [&](std::size_t bytes) {
    char* p = at;
    at += (bytes + 15) / 16 * 16;
    return static_cast<void*>(p);
  };
  GroupedArgs a;
  a.shapes = static_cast<int*>(take(3 * sizeof(int) * g));
  a.a = static_cast<const void**>(take(sizeof(void*) * g));
  a.b = static_cast<const void**>(take(sizeof(void*) * g));
  a.c = static_cast<void**>(take(sizeof(void*) * g));
  a.lda = static_cast<std::int64_t*>(take(sizeof(std::int64_t) * g));
  a.ldb = static_cast<std::int64_t*>(take(sizeof(std::int64_t) * g));
  a.ldc = static_cast<std::int64_t*>(take(sizeof(std::int64_t) * g));
  return a;
}

void grouped_plan(const GroupedPlan* plans, int count, const int* offsets, int groups, cudaStream_t stream) {
  if (count <= 0 || groups <= 0) return;
  if (count > kMaxGroupedPlans) check_cuda(cudaErrorInvalidValue, "grouped_plan: more plans than kMaxGroupedPlans");
  Plans all;
  for (int i = 0; i < count; ++i) all.p[i] = plans[i];
  const int threads = count * groups;
  plan_k<<<(threads + 127) / 128, 128, 0, stream>>>(all, count, offsets, groups);
}

}  // namespace dlm::train::cuda
