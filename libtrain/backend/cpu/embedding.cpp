// Embedding lookup. Forward copies rows; backward scatters them back with +=, split over the hidden
// columns so that threads never write the same element (repeated ids in a batch are common).
#include <cstring>

#include <fmt/format.h>

#include "cpu_backend.h"
#include "dlm/common/error.h"

namespace dlm::train::cpu {

// -1 marks an id another tensor-parallel rank holds (a zero row); anything else outside the table is a bug.
static void check_ids(const std::int32_t* ids, std::int64_t n, std::int64_t rows) {
  for (std::int64_t i = 0; i < n; ++i)
    if (ids[i] < -1 || ids[i] >= rows)
      fail(fmt::format("cpu backend: embedding: id {} at position {} is outside the table of {} rows", ids[i], i, rows));
}

void CpuBackend::embedding_forward(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const std::int64_t rows = table.dim(0), h = table.dim(1), n = ids.numel();
  expect_numel("embedding_forward", "out", out, n * h);
  const std::int32_t* id = i32(ids);
  check_ids(id, n, rows);
  const float* t = f32(table);
  float* o = f32(out);
  parallel_for(n, 64, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      if (id[i] < 0) std::memset(o + i * h, 0, sizeof(float) * h);
      else std::memcpy(o + i * h, t + id[i] * h, sizeof(float) * h);
    }
  });
}

void CpuBackend::embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dtable) {
  const std::int64_t rows = dtable.dim(0), h = dtable.dim(1), n = ids.numel();
  expect_numel("embedding_backward", "dout", dout, n * h);
  const std::int32_t* id = i32(ids);
  check_ids(id, n, rows);
  const float* d = f32(dout);
  float* t = f32(dtable);
  parallel_for(h, 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = 0; i < n; ++i) {
      if (id[i] < 0) continue;
      float* row = t + id[i] * h;
      const float* src = d + i * h;
      for (std::int64_t j = b; j < e; ++j) row[j] += src[j];
    }
  });
}

}  // namespace dlm::train::cpu
