// Scaled dot-product attention with grouped KV heads, one (batch, KV group) per task so that the
// heads sharing a KV head accumulate dk, dv on one thread. Per head, with s = 1/sqrt(D):
//   S = s q k^T (masked to -inf), lse_i = log sum_j exp(S_ij), P = exp(S - lse), out = P v.
// Backward recomputes P from the saved lse (no L x L tensor is kept between passes):
//   dv += P^T dout,  dP = dout v^T,  dS = P (dP - delta),  delta_i = sum_d dout_id out_id,
//   dq = s dS k,  dk += s dS^T q.
// The L x L products go through BLAS with strided rows (q rows are H*D apart, k and v rows G*D).
// The forward also takes fewer queries than keys (a sampler's window over cached keys, bidirectional):
// query row i's scores, softmax and output are computed exactly as in a forward over every row.
#include <cblas.h>

#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "cpu_backend.h"
#include "dlm/common/error.h"

namespace dlm::train::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// l queries and lk keys per sequence (lk == l except in a bidirectional forward).
struct AttnShape {
  std::int64_t b, l, lk, h, g, d;
};

AttnShape check(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, AttentionKind kind,
                const Tensor& key_valid, const Tensor& out, const Tensor& lse, bool fewer_queries) {
  if (q.rank() != 4 || k.rank() != 4) fail(fmt::format("cpu backend: {}: q and k must be [B, L, heads, D]", op));
  const AttnShape s{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  if (s.g <= 0 || s.h % s.g != 0)
    fail(fmt::format("cpu backend: {}: {} KV heads do not divide {} heads", op, s.g, s.h));
  if (s.l != s.lk && (!fewer_queries || kind == AttentionKind::kCausal || s.l > s.lk))
    fail(fmt::format("cpu backend: {}: {} queries for {} keys (fewer queries only in a bidirectional forward)", op,
                     s.l, s.lk));
  expect_numel(op, "k", k, s.b * s.lk * s.g * s.d);
  expect_numel(op, "v", v, s.b * s.lk * s.g * s.d);
  expect_numel(op, "out", out, s.b * s.l * s.h * s.d);
  expect_numel(op, "lse", lse, s.b * s.h * s.l);
  if (key_valid.defined()) expect_numel(op, "key_valid", key_valid, s.b * s.lk);
  return s;
}

// Writes s q k^T with the mask applied into S [l, lk] for one (batch, head).
void scores(const AttnShape& s, const float* q, const float* k, AttentionKind kind, const std::uint8_t* valid,
            float* S) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.l), int(s.lk), int(s.d), scale, q, int(s.h * s.d), k,
              int(s.g * s.d), 0.0f, S, int(s.lk));
  for (std::int64_t i = 0; i < s.l; ++i) {
    float* row = S + i * s.lk;
    if (kind == AttentionKind::kCausal)
      for (std::int64_t j = i + 1; j < s.lk; ++j) row[j] = kNegInf;
    if (valid)
      for (std::int64_t j = 0; j < s.lk; ++j)
        if (!valid[j]) row[j] = kNegInf;
  }
}

}  // namespace

void CpuBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionKind kind,
                                   const Tensor& key_valid, const Tensor& out, const Tensor& lse) {
  const AttnShape s = check("attention_forward", q, k, v, kind, key_valid, out, lse, true);
  const std::int64_t r = s.h / s.g;
  const float *pq = f32(q), *pk = f32(k), *pv = f32(v);
  const std::uint8_t* pvalid = key_valid.defined() ? u8(key_valid) : nullptr;
  float *po = f32(out), *plse = f32(lse);
  parallel_blas_for(s.b * s.g, 1, [&](std::int64_t first, std::int64_t last) {
    std::vector<float> S(static_cast<std::size_t>(s.l * s.lk));
    for (std::int64_t task = first; task < last; ++task) {
      const std::int64_t b = task / s.g, g = task % s.g;
      const float* kg = pk + (b * s.lk * s.g + g) * s.d;
      const float* vg = pv + (b * s.lk * s.g + g) * s.d;
      const std::uint8_t* valid = pvalid ? pvalid + b * s.lk : nullptr;
      for (std::int64_t h = g * r; h < (g + 1) * r; ++h) {
        scores(s, pq + (b * s.l * s.h + h) * s.d, kg, kind, valid, S.data());
        float* lrow = plse + (b * s.h + h) * s.l;
        for (std::int64_t i = 0; i < s.l; ++i) {
          float* row = S.data() + i * s.lk;
          float m = kNegInf;
          for (std::int64_t j = 0; j < s.lk; ++j) m = std::max(m, row[j]);
          if (m == kNegInf) {  // no visible key: zero output, no gradient
            for (std::int64_t j = 0; j < s.lk; ++j) row[j] = 0.0f;
            lrow[i] = kNegInf;
            continue;
          }
          double sum = 0;
          for (std::int64_t j = 0; j < s.lk; ++j) sum += std::exp(double(row[j]) - m);
          const float l = static_cast<float>(m + std::log(sum));
          lrow[i] = l;
          for (std::int64_t j = 0; j < s.lk; ++j) row[j] = std::exp(row[j] - l);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(s.l), int(s.d), int(s.lk), 1.0f, S.data(),
                    int(s.lk), vg, int(s.g * s.d), 0.0f, po + (b * s.l * s.h + h) * s.d, int(s.h * s.d));
      }
    }
  });
}

void CpuBackend::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& lse, AttentionKind kind,
                                    const Tensor& key_valid, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const AttnShape s = check("attention_backward", q, k, v, kind, key_valid, out, lse, false);
  expect_numel("attention_backward", "dout", dout, out.numel());
  expect_numel("attention_backward", "dq", dq, q.numel());
  expect_numel("attention_backward", "dk", dk, k.numel());
  expect_numel("attention_backward", "dv", dv, v.numel());
  const std::int64_t r = s.h / s.g, hd = s.h * s.d, gd = s.g * s.d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  const float *pq = f32(q), *pk = f32(k), *pv = f32(v), *po = f32(out), *plse = f32(lse), *pdo = f32(dout);
  const std::uint8_t* pvalid = key_valid.defined() ? u8(key_valid) : nullptr;
  float *pdq = f32(dq), *pdk = f32(dk), *pdv = f32(dv);
  parallel_blas_for(s.b * s.g, 1, [&](std::int64_t first, std::int64_t last) {
    std::vector<float> P(static_cast<std::size_t>(s.l * s.l)), dP(P.size());
    for (std::int64_t task = first; task < last; ++task) {
      const std::int64_t b = task / s.g, g = task % s.g;
      const float* kg = pk + (b * s.l * s.g + g) * s.d;
      const float* vg = pv + (b * s.l * s.g + g) * s.d;
      float* dkg = pdk + (b * s.l * s.g + g) * s.d;
      float* dvg = pdv + (b * s.l * s.g + g) * s.d;
      for (std::int64_t i = 0; i < s.l; ++i)
        for (std::int64_t c = 0; c < s.d; ++c) dkg[i * gd + c] = dvg[i * gd + c] = 0.0f;
      const std::uint8_t* valid = pvalid ? pvalid + b * s.l : nullptr;
      for (std::int64_t h = g * r; h < (g + 1) * r; ++h) {
        const float* qh = pq + (b * s.l * s.h + h) * s.d;
        const float* oh = po + (b * s.l * s.h + h) * s.d;
        const float* doh = pdo + (b * s.l * s.h + h) * s.d;
        const float* lrow = plse + (b * s.h + h) * s.l;
        scores(s, qh, kg, kind, valid, P.data());
        for (std::int64_t i = 0; i < s.l; ++i) {
          float* row = P.data() + i * s.l;
          for (std::int64_t j = 0; j < s.l; ++j) row[j] = lrow[i] == kNegInf ? 0.0f : std::exp(row[j] - lrow[i]);
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(s.l), int(s.d), int(s.l), 1.0f, P.data(), int(s.l),
                    doh, int(hd), 1.0f, dvg, int(gd));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.l), int(s.l), int(s.d), 1.0f, doh, int(hd), vg,
                    int(gd), 0.0f, dP.data(), int(s.l));
        for (std::int64_t i = 0; i < s.l; ++i) {
          double delta = 0;
          for (std::int64_t c = 0; c < s.d; ++c) delta += double(doh[i * hd + c]) * oh[i * hd + c];
          float* prow = P.data() + i * s.l;
          const float* dprow = dP.data() + i * s.l;
          for (std::int64_t j = 0; j < s.l; ++j) prow[j] = prow[j] * (dprow[j] - static_cast<float>(delta));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(s.l), int(s.d), int(s.l), scale, P.data(),
                    int(s.l), kg, int(gd), 0.0f, pdq + (b * s.l * s.h + h) * s.d, int(hd));
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(s.l), int(s.d), int(s.l), scale, P.data(), int(s.l),
                    qh, int(hd), 1.0f, dkg, int(gd));
      }
    }
  });
}

}  // namespace dlm::train::cpu
