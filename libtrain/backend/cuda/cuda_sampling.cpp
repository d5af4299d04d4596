// CudaModel behind the samplers' LogitsFn / GreedyFn (device.h): rows of a left-padded batch run in groups
// of equal padding, each without its pad columns.
#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/device.h"

namespace dlm::train {
namespace {

// Rows of a left-padded batch grouped by their padding: each group runs as one batch without its pad
// columns (never attended, so the other positions' values are those of the padded run).
std::map<std::int64_t, std::vector<std::int64_t>> rows_by_padding(const SequenceBatch& b) {
  std::map<std::int64_t, std::vector<std::int64_t>> groups;
  for (std::int64_t r = 0; r < b.rows; ++r) {
    const auto* a = b.attention.data() + r * b.len;
    const std::int64_t pad = std::find(a, a + b.len, std::uint8_t{1}) - a;
    if (pad == b.len || std::find(a + pad, a + b.len, std::uint8_t{0}) != a + b.len)
      fail(fmt::format("CUDA sampling: row {}'s attention is not left padding followed by tokens", r));
    groups[pad].push_back(r);
  }
  return groups;
}

// Runs `run(rows, len, ids, positions)` per padding group and scatters its per-position results (width
// values each) into `out` [rows, len, width]; pad positions read 0.
template <typename T, typename Run>
void by_group(const SequenceBatch& b, std::int64_t width, std::vector<T>& out, Run run) {
  out.assign(static_cast<std::size_t>(b.rows * b.len * width), T{});
  for (const auto& [pad, rows] : rows_by_padding(b)) {
    const std::int64_t len = b.len - pad, g = static_cast<std::int64_t>(rows.size());
    std::vector<std::int32_t> ids, positions;
    for (std::int64_t r : rows) {
      ids.insert(ids.end(), b.ids.begin() + r * b.len + pad, b.ids.begin() + (r + 1) * b.len);
      if (!b.position_ids.empty())
        positions.insert(positions.end(), b.position_ids.begin() + r * b.len + pad, b.position_ids.begin() + (r + 1) * b.len);
    }
    const std::vector<T> got = run(g, len, ids, positions);
    for (std::int64_t k = 0; k < g; ++k)
      std::copy_n(got.begin() + k * len * width, len * width, out.begin() + (rows[k] * b.len + pad) * width);
  }
}

}  // namespace

CudaSampling make_cuda_sampling(const ckpt::ModelConfig& config, const ckpt::TensorSet& weights,
                                const CudaOptions& options) {
  auto model = std::make_shared<CudaModel>(config, CudaShard{}, options);
  for (const auto& spec : ckpt::model_tensors(model->config())) {
    auto it = weights.find(spec.name);
    if (it == weights.end()) fail(fmt::format("CUDA sampling: the checkpoint has no tensor {}", spec.name));
    if (it->second.dtype != ckpt::TensorDType::kFloat32)
      fail(fmt::format("CUDA sampling: tensor {} is not fp32", spec.name));
    model->import_parameter(spec.name, it->second.f32());
  }
  const bool causal = config.attention_mask == ckpt::AttentionMask::kCausal;
  const std::int64_t vocab = config.vocab_size;
  CudaSampling s;
  s.vocab = vocab;
  s.parameters = model->parameter_count();
  s.logits = [model, causal, vocab](const SequenceBatch& b, std::vector<float>& logits) {
    by_group<float>(b, vocab, logits, [&](std::int64_t rows, std::int64_t len, const auto& ids, const auto& positions) {
      return model->forward_logits(rows, len, causal, ids, positions);
    });
  };
  s.greedy = [model, causal](const SequenceBatch& b, std::int64_t first, std::int64_t end,
                              std::vector<std::int32_t>& tokens, std::vector<float>& confidence) {
    // Tokens and confidences of one group come from one call: keep the confidences beside the tokens.
    std::vector<float> conf_group;
    by_group<std::int32_t>(b, 1, tokens, [&](std::int64_t rows, std::int64_t len, const auto& ids, const auto& positions) {
      std::vector<std::int32_t> t;
      std::vector<float> c;
      // The group's columns start after its padding: the window moves left by it, clipped at 0.
      const std::int64_t pad = b.len - len;
      const std::int64_t lo = std::max<std::int64_t>(first - pad, 0), hi = std::max<std::int64_t>(end - pad, lo + 1);
      model->greedy_tokens(rows, len, causal, ids, positions, t, c, {lo, std::min(hi, len)});
      conf_group.insert(conf_group.end(), c.begin(), c.end());
      return t;
    });
    // The same walk for the confidences, from the values kept above, group by group.
    std::size_t at = 0;
    by_group<float>(b, 1, confidence, [&](std::int64_t rows, std::int64_t len, const auto&, const auto&) {
      std::vector<float> c(conf_group.begin() + static_cast<std::ptrdiff_t>(at),
                           conf_group.begin() + static_cast<std::ptrdiff_t>(at + rows * len));
      at += static_cast<std::size_t>(rows * len);
      return c;
    });
  };
  s.keep_alive = model;
  return s;
}

}  // namespace dlm::train
