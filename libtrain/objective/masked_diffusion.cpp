// The objectives as per-position weights (see include/dlm/train/objective.h for the math).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/objective.h"
#include "dlm/train/philox.h"

namespace dlm::train {
namespace {

// Stream domains of the noise generator; a value is addressed by (domain, sample, position).
constexpr std::uint32_t kNoiseLevel = 1;     // t of a sample
constexpr std::uint32_t kNoiseMask = 2;      // u_j of a position
constexpr std::uint32_t kNoiseFallback = 3;  // the forced position of a row that drew no mask

void check_batch(const SampleBatch& s) {
  auto n = static_cast<std::size_t>(s.batch * s.seq);
  if (s.batch <= 0 || s.seq <= 0) fail(fmt::format("objective: empty micro-batch ({} x {})", s.batch, s.seq));
  if (s.tokens.size() != n || s.labels.size() != n || s.loss_mask.size() != n ||
      s.sample_index.size() != static_cast<std::size_t>(s.batch))
    fail(fmt::format("objective: micro-batch columns disagree with its shape {} x {}", s.batch, s.seq));
}

// The first `cut` columns of every row, starting at column `from`.
template <typename T>
std::vector<T> columns(const std::vector<T>& v, std::int64_t seq, std::int64_t batch, std::int64_t from,
                       std::int64_t count) {
  std::vector<T> out(static_cast<std::size_t>(batch * count));
  for (std::int64_t b = 0; b < batch; ++b)
    std::copy_n(v.begin() + b * seq + from, count, out.begin() + b * count);
  return out;
}

ModelBatch autoregressive(const SampleBatch& s) {
  ModelBatch m{s.batch, s.seq, true, s.tokens, s.labels, {}, {}, {}};
  m.position_ids.resize(s.tokens.size());
  double mask_sum = 0;
  for (float v : s.loss_mask) mask_sum += v;
  m.weights.resize(s.tokens.size());
  for (std::size_t i = 0; i < m.weights.size(); ++i) {
    m.position_ids[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(s.seq));
    m.weights[i] = mask_sum > 0 ? static_cast<float>(s.loss_mask[i] / mask_sum) : 0.0f;
  }
  return m;
}

ModelBatch noshift(const ObjectiveOptions& o, const SampleBatch& s, const MicroBatchPosition& where) {
  std::int64_t length = s.seq;
  if (where.training && o.varilen_prob > 0) {
    auto seed = static_cast<std::uint64_t>(where.iteration * where.num_micro_batches + where.micro_batch);
    length = variable_length(o.varilen_prob, seed, s.seq);
  }
  if (length < 2) fail(fmt::format("objective: difflm-noshift needs --seq-length >= 2, got {}", length));
  const std::int64_t n = length - 1;
  ModelBatch m;
  m.batch = s.batch;
  m.seq = n;
  m.input_ids = columns(s.tokens, s.seq, s.batch, 1, n);
  m.labels = columns(s.labels, s.seq, s.batch, 0, n);
  auto loss_mask = columns(s.loss_mask, s.seq, s.batch, 0, n);
  m.position_ids.resize(m.input_ids.size());
  m.masked.assign(m.input_ids.size(), 0);
  m.weights.assign(m.input_ids.size(), 0.0f);
  double mask_sum = 0;
  for (float v : loss_mask) mask_sum += v;
  CounterRng rng(o.seed);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const std::uint64_t sample = s.sample_index[static_cast<std::size_t>(b)];
    const double t = rng.uniform(kNoiseLevel, sample, 0);
    std::int64_t count = 0;
    auto* masked = m.masked.data() + b * n;
    for (std::int64_t j = 0; j < n; ++j) {
      masked[j] = rng.uniform(kNoiseMask, sample, static_cast<std::uint32_t>(j)) < t;
      count += masked[j];
    }
    if (count == 0) {
      auto j = static_cast<std::int64_t>(rng.uniform(kNoiseFallback, sample, 0) * static_cast<double>(n));
      masked[std::min(j, n - 1)] = 1;
      count = 1;
    }
    // masked / p_mask with p_mask = count / n, normalised by the micro-batch's loss_mask sum.
    const double scale = mask_sum > 0 ? static_cast<double>(n) / static_cast<double>(count) / mask_sum : 0.0;
    for (std::int64_t j = 0; j < n; ++j) {
      auto i = static_cast<std::size_t>(b * n + j);
      m.position_ids[i] = static_cast<std::int32_t>(j + 1);
      if (masked[j]) {
        m.input_ids[i] = o.mask_token;
        m.weights[i] = static_cast<float>(loss_mask[i] * scale);
      }
    }
  }
  return m;
}

ModelBatch llada(const ObjectiveOptions& o, const SampleBatch& s) {
  ModelBatch m{s.batch, s.seq, false, s.tokens, s.tokens, {}, {}, {}};
  const auto n = static_cast<std::size_t>(s.batch * s.seq);
  m.position_ids.resize(n);
  m.masked.assign(n, 0);
  m.weights.assign(n, 0.0f);
  CounterRng rng(o.seed);
  const double denom = static_cast<double>(s.batch * s.seq);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const std::uint64_t sample = s.sample_index[static_cast<std::size_t>(b)];
    const double p = (1 - o.llada_eps) * rng.uniform(kNoiseLevel, sample, 0) + o.llada_eps;
    for (std::int64_t j = 0; j < s.seq; ++j) {
      auto i = static_cast<std::size_t>(b * s.seq + j);
      m.position_ids[i] = static_cast<std::int32_t>(j);
      if (rng.uniform(kNoiseMask, sample, static_cast<std::uint32_t>(j)) < p) {
        m.masked[i] = 1;
        m.input_ids[i] = o.mask_token;
        m.weights[i] = static_cast<float>(s.loss_mask[i] / p / denom);
      }
    }
  }
  return m;
}

}  // namespace

ObjectiveKind parse_objective_kind(const std::string& name) {
  if (name == "difflm-noshift") return ObjectiveKind::kDiffusion;
  if (name == "llada") return ObjectiveKind::kDiffusionLlada;
  if (name == "vanilla") return ObjectiveKind::kAutoregressive;
  fail(fmt::format("unknown objective '{}': expected difflm-noshift, llada or vanilla", name));
}

const char* objective_kind_name(ObjectiveKind kind) {
  switch (kind) {
    case ObjectiveKind::kDiffusion: return "difflm-noshift";
    case ObjectiveKind::kDiffusionLlada: return "llada";
    case ObjectiveKind::kAutoregressive: return "vanilla";
  }
  return "?";
}

ModelBatch make_model_batch(const ObjectiveOptions& options, const SampleBatch& samples,
                            const MicroBatchPosition& where) {
  check_batch(samples);
  if (options.kind != ObjectiveKind::kAutoregressive && options.mask_token < 0)
    fail("objective: the diffusion objectives need a mask token (--mask-token)");
  switch (options.kind) {
    case ObjectiveKind::kDiffusion: return noshift(options, samples, where);
    case ObjectiveKind::kDiffusionLlada: return llada(options, samples);
    case ObjectiveKind::kAutoregressive: return autoregressive(samples);
  }
  fail("objective: unknown kind");
}

double weighted_cross_entropy(std::span<const float> logits, std::int64_t vocab, const ModelBatch& batch,
                              std::span<float> dlogits) {
  const auto rows = static_cast<std::size_t>(batch.batch * batch.seq);
  if (logits.size() != rows * static_cast<std::size_t>(vocab))
    fail(fmt::format("weighted_cross_entropy: {} logits for {} rows of {}", logits.size(), rows, vocab));
  double total = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * static_cast<std::size_t>(vocab);
    const double w = batch.weights[r];
    double mx = row[0];
    for (std::int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    double sum = 0;
    for (std::int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    const auto label = batch.labels[r];
    if (label < 0 || label >= vocab)
      fail(fmt::format("weighted_cross_entropy: label {} outside the vocabulary of {}", label, vocab));
    if (w != 0) total += w * (mx + std::log(sum) - row[label]);
    if (!dlogits.empty()) {
      float* d = dlogits.data() + r * static_cast<std::size_t>(vocab);
      for (std::int64_t v = 0; v < vocab; ++v)
        d[v] = w == 0 ? 0.0f : static_cast<float>(w * (std::exp(row[v] - mx) / sum - (v == label ? 1.0 : 0.0)));
    }
  }
  return total;
}

}  // namespace dlm::train
