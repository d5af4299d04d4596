// CudaModel behind the samplers' LogitsFn / GreedyFn / CachedLogitsModel (device.h): rows of a left-padded batch
// run in groups of equal padding, each without its pad columns; the block KV cache keeps a store per group,
// named by its padding.
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

// One padding group: its rows, packed without their pad columns.
struct Group {
  std::int64_t pad, rows, len;
  std::vector<std::int64_t> members;
  std::vector<std::int32_t> ids, positions;
};
std::vector<Group> padding_groups(const SequenceBatch& b) {
  std::vector<Group> out;
  for (const auto& [pad, rows] : rows_by_padding(b)) {
    Group g{pad, static_cast<std::int64_t>(rows.size()), b.len - pad, rows, {}, {}};
    for (std::int64_t r : rows) {
      g.ids.insert(g.ids.end(), b.ids.begin() + r * b.len + pad, b.ids.begin() + (r + 1) * b.len);
      if (!b.position_ids.empty())
        g.positions.insert(g.positions.end(), b.position_ids.begin() + r * b.len + pad,
                           b.position_ids.begin() + (r + 1) * b.len);
    }
    out.push_back(std::move(g));
  }
  return out;
}

// Runs `run(group)`, which returns the group's values [group rows, len, width], per padding group and scatters
// them into `out` [rows, len, width]; pad positions read 0.
template <typename T, typename Run>
void by_group(const SequenceBatch& b, std::int64_t width, std::vector<T>& out, Run run) {
  out.assign(static_cast<std::size_t>(b.rows * b.len * width), T{});
  for (const Group& g : padding_groups(b)) {
    const std::vector<T> got = run(g);
    for (std::int64_t k = 0; k < g.rows; ++k)
      std::copy_n(got.begin() + k * g.len * width, g.len * width,
                  out.begin() + (g.members[static_cast<std::size_t>(k)] * b.len + g.pad) * width);
  }
}

// A group's columns for the batch's [first, end): moved left by its padding, clipped at 0 (a column before a
// row's first token is padding there).
ColumnWindow group_columns(const Group& g, std::int64_t first, std::int64_t end) {
  const std::int64_t lo = std::max<std::int64_t>(first - g.pad, 0);
  return {lo, std::min(std::max(end - g.pad, lo + 1), g.len)};
}

// The greedy tokens and confidences [rows, len] of `call(group, tokens, confidence)` per padding group.
template <typename Call>
void greedy_by_group(const SequenceBatch& b, std::vector<std::int32_t>& tokens, std::vector<float>& confidence,
                     Call call) {
  tokens.assign(static_cast<std::size_t>(b.rows * b.len), 0);
  confidence.assign(tokens.size(), 0.0f);
  for (const Group& g : padding_groups(b)) {
    std::vector<std::int32_t> t;
    std::vector<float> c;
    call(g, t, c);
    for (std::int64_t k = 0; k < g.rows; ++k) {
      const auto to = (g.members[static_cast<std::size_t>(k)] * b.len + g.pad);
      std::copy_n(t.begin() + k * g.len, g.len, tokens.begin() + to);
      std::copy_n(c.begin() + k * g.len, g.len, confidence.begin() + to);
    }
  }
}

// After a storing forward of `b`: only its groups' stores stay.
void keep_stores_of(CudaModel& model, const SequenceBatch& b) {
  std::vector<int> names;
  for (const auto& [pad, rows] : rows_by_padding(b)) names.push_back(static_cast<int>(pad));
  model.release_kv_stores(names);
}

}  // namespace

CudaSampling cuda_sampling(std::shared_ptr<CudaModel> model) {
  const bool causal = model->config().attention_mask == ckpt::AttentionMask::kCausal;
  const std::int64_t vocab = model->config().vocab_size;
  using Mode = KvCacheUse::Mode;
  CudaSampling s;
  s.vocab = vocab;
  s.parameters = model->parameter_count();
  s.logits = [model, causal, vocab](const SequenceBatch& b, std::vector<float>& logits) {
    by_group<float>(b, vocab, logits, [&](const Group& g) {
      return model->forward_logits(g.rows, g.len, causal, g.ids, g.positions);
    });
  };
  s.greedy = [model, causal](const SequenceBatch& b, std::int64_t first, std::int64_t end,
                              std::vector<std::int32_t>& tokens, std::vector<float>& confidence) {
    greedy_by_group(b, tokens, confidence, [&](const Group& g, auto& t, auto& c) {
      model->greedy_tokens(g.rows, g.len, causal, g.ids, g.positions, t, c, group_columns(g, first, end));
    });
  };
  // The block KV cache: a store per padding group, named by the padding (a causal model is refused there).
  s.cached.full = [model, causal, vocab](const SequenceBatch& b, std::vector<float>& logits) {
    by_group<float>(b, vocab, logits, [&](const Group& g) {
      return model->forward_logits(g.rows, g.len, causal, g.ids, g.positions, {Mode::kStore, static_cast<int>(g.pad)});
    });
    keep_stores_of(*model, b);
  };
  s.cached.full_greedy = [model, causal](const SequenceBatch& b, std::int64_t first, std::int64_t end,
                                 std::vector<std::int32_t>& tokens, std::vector<float>& confidence) {
    greedy_by_group(b, tokens, confidence, [&](const Group& g, auto& t, auto& c) {
      model->greedy_tokens(g.rows, g.len, causal, g.ids, g.positions, t, c, group_columns(g, first, end),
                           {Mode::kStore, static_cast<int>(g.pad)});
    });
    keep_stores_of(*model, b);
  };
  // A window's logits [rows, end - first, vocab]: a group's columns before its first token read 0.
  s.cached.window = [model, causal, vocab](const SequenceBatch& b, std::int64_t first, std::int64_t end,
                                   std::vector<float>& logits) {
    const std::int64_t width = end - first;
    logits.assign(static_cast<std::size_t>(b.rows * width * vocab), 0.0f);
    for (const Group& g : padding_groups(b)) {
      const ColumnWindow cols = group_columns(g, first, end);
      const std::vector<float> got = model->forward_logits(g.rows, g.len, causal, g.ids, g.positions,
                                                           {Mode::kWindow, static_cast<int>(g.pad), cols});
      const std::int64_t w = cols.end - cols.first, at = cols.first + g.pad - first;
      for (std::int64_t k = 0; k < g.rows; ++k)
        std::copy_n(got.begin() + k * w * vocab, w * vocab,
                    logits.begin() + (g.members[static_cast<std::size_t>(k)] * width + at) * vocab);
    }
  };
  s.cached.window_greedy = [model, causal](const SequenceBatch& b, std::int64_t first, std::int64_t end, std::int64_t read_end,
                                   std::vector<std::int32_t>& tokens, std::vector<float>& confidence) {
    greedy_by_group(b, tokens, confidence, [&](const Group& g, auto& t, auto& c) {
      model->greedy_tokens(g.rows, g.len, causal, g.ids, g.positions, t, c, group_columns(g, first, read_end),
                           {Mode::kWindow, static_cast<int>(g.pad), group_columns(g, first, end)});
    });
  };
  s.keep_alive = model;
  return s;
}

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
  return cuda_sampling(std::move(model));
}

}  // namespace dlm::train
