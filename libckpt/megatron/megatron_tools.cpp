// dlm-ckpt validate / inspect of Megatron checkpoints (megatron.h, tools.h).
#include <cmath>

#include <fmt/format.h>

#include "dlm/ckpt/megatron.h"
#include "dlm/ckpt/tools.h"

namespace dlm::ckpt {

void validate_megatron(const std::string& path, Report& r) {
  const MegatronCheckpoint m = load_megatron(path);
  r.lines.push_back(fmt::format("Megatron checkpoint {}: iteration {}, TP {} PP {}, {} layers", path, m.state.iteration,
                                m.layout.tp, m.layout.pp, m.config.num_layers));
  std::int64_t non_finite = 0;
  for (const auto& [group, set] : {std::pair<const char*, const TensorSet*>{"", &m.tensors}, {"exp_avg ", &m.exp_avg}, {"exp_avg_sq ", &m.exp_avg_sq}})
    for (const auto& [name, t] : *set) {
      std::int64_t bad = 0;
      for (float x : t.f32()) bad += !std::isfinite(x);
      if (bad) r.errors.push_back(fmt::format("{}{}: {} NaN/Inf values", group, name, bad));
      non_finite += bad;
    }
  r.lines.push_back(fmt::format("every rank file read (CRC-32 checked); {} tensors merge onto the args' model{}; {} NaN/Inf",
                                m.tensors.size(), m.exp_avg.empty() ? "" : fmt::format(", with Adam state (step {})", m.state.optimizer_steps),
                                non_finite));
}

std::string inspect_megatron(const std::string& path) {
  const MegatronCheckpoint m = load_megatron(path);
  std::string out = fmt::format("Megatron checkpoint {}\nmodel: {}\n", path, model_config_to_json(m.config));
  out += fmt::format("layout: tp {} pp {}, layers per stage [{}]\n", m.layout.tp, m.layout.pp, fmt::join(m.layout.layers_per_stage, ", "));
  out += fmt::format("training: iteration {}, consumed samples {}\n", m.state.iteration, m.state.consumed_samples);
  out += m.exp_avg.empty() ? "optimizer: no Adam state\n"
                           : fmt::format("optimizer: Adam step {}, fp32 masters and moments of every tensor\n", m.state.optimizer_steps);
  std::int64_t total = 0;
  for (const auto& [name, t] : m.tensors) {
    out += fmt::format("  {:<56} [{}]\n", name, fmt::join(t.shape, ", "));
    total += t.numel();
  }
  out += fmt::format("{} tensors, {} parameters\n", m.tensors.size(), total);
  return out;
}

}  // namespace dlm::ckpt
