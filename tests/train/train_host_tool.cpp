// Test driver for interop_train_host.py: reads one JSON request on stdin, prints one JSON answer.
//   {"op": "lr", ...LrScheduleOptions fields, "steps": [...]}       -> {"lr": [...]}
//     (warmup, decay, wsd_decay in iterations; warmup_samples, decay_samples, wsd_decay_samples replace them)
//   {"op": "adamw", "params": [[...]...], "no_decay": [...], "grads": [[[...]...]...], "lrs": [...], ...}
//   {"op": "objective", "kind", "seed", "mask", "varilen_prob", "iteration", "micro_batches", "micro_batch",
//    "tokens", "labels", "loss_mask" ([B][L]), "sample_index", "logits" ([B*L'][V])}
//      -> {"input_ids", "labels", "position_ids", "masked", "seq", "loss"}
//   {"op": "varilen", "prob", "length", "seeds": [...]} -> {"lengths": [...]}
//   {"op": "tensorboard", "dir": D, "events": [[step, {tag: value}]...]} -> {"path": event file}
//   {"op": "diffusion" | "ar", "A": [[..]], "B": [[..]], "C": [[..]], "prompts": [[..]], options...}
// The synthetic model of "diffusion"/"ar": logits[v] = A[id][v] + B[pos][v] + C[(sum of the row's
// attended ids) % rows(C)][v], in fp32, in that order.
#include <iostream>

#include <nlohmann/json.hpp>

#include "dlm/train/lr_schedule.h"
#include "dlm/train/metrics.h"
#include "dlm/train/objective.h"
#include "dlm/train/optimizer.h"
#include "dlm/train/sampler.h"

using json = nlohmann::json;
using namespace dlm::train;

namespace {

json lr(const json& q) {
  LrScheduleOptions o;
  o.max_lr = q["max_lr"];
  o.min_lr = q["min_lr"];
  o.init_lr = q.value("init_lr", 0.0);
  o.warmup_iters = q["warmup"];
  o.decay_iters = q["decay"];
  o.style = parse_lr_decay_style(q["style"]);
  o.wsd_decay_iters = q.value("wsd_decay", 0);
  o.wsd_style = parse_wsd_decay_style(q.value("wsd_style", "exponential"));
  o.global_batch_size = q.value("global_batch_size", 1);
  if (q.contains("warmup_samples")) o.warmup_samples = q["warmup_samples"].get<double>();
  if (q.contains("decay_samples")) o.decay_samples = q["decay_samples"].get<std::int64_t>();
  if (q.contains("wsd_decay_samples")) o.wsd_decay_samples = q["wsd_decay_samples"].get<std::int64_t>();
  LrSchedule s(o);
  json out = json::array();
  for (auto step : q["steps"]) out.push_back(s.at(step.get<std::int64_t>()));
  return {{"lr", out}};
}

json adamw(const json& q) {
  auto params = q["params"].get<std::vector<std::vector<float>>>();
  auto no_decay = q["no_decay"].get<std::vector<bool>>();
  AdamW opt({q["beta1"], q["beta2"], q["eps"], q["weight_decay"]});
  const auto lrs = q["lrs"].get<std::vector<double>>();
  for (std::size_t s = 0; s < lrs.size(); ++s) {
    auto grads = q["grads"][s].get<std::vector<std::vector<float>>>();
    std::vector<std::span<float>> spans(grads.begin(), grads.end());
    double norm = clip_grad_norm(spans, q.value("clip", 0.0));
    (void)norm;
    std::vector<ParamRef> refs;
    for (std::size_t t = 0; t < params.size(); ++t) refs.push_back({"t", params[t], grads[t], !no_decay[t]});
    opt.step(refs, lrs[s]);
  }
  return {{"params", params}};
}

json objective(const json& q) {
  ObjectiveOptions o;
  o.kind = parse_objective_kind(q["kind"]);
  o.seed = q["seed"];
  o.mask_token = q["mask"];
  o.varilen_prob = q["varilen_prob"];
  SampleBatch s;
  const auto tokens = q["tokens"].get<std::vector<std::vector<std::int32_t>>>();
  const auto labels = q["labels"].get<std::vector<std::vector<std::int32_t>>>();
  const auto mask = q["loss_mask"].get<std::vector<std::vector<float>>>();
  s.batch = static_cast<std::int64_t>(tokens.size());
  s.seq = static_cast<std::int64_t>(tokens[0].size());
  for (std::size_t b = 0; b < tokens.size(); ++b) {
    s.tokens.insert(s.tokens.end(), tokens[b].begin(), tokens[b].end());
    s.labels.insert(s.labels.end(), labels[b].begin(), labels[b].end());
    s.loss_mask.insert(s.loss_mask.end(), mask[b].begin(), mask[b].end());
  }
  s.sample_index = q["sample_index"].get<std::vector<std::uint64_t>>();
  ModelBatch m = make_model_batch(o, s, {q["iteration"], q["micro_batches"], q["micro_batch"], true});
  json out = {{"input_ids", m.input_ids}, {"labels", m.labels}, {"position_ids", m.position_ids},
              {"masked", m.masked}, {"seq", m.seq}};
  if (q.contains("logits")) {
    std::vector<float> logits;
    std::int64_t vocab = 0;
    for (const auto& row : q["logits"]) {
      vocab = static_cast<std::int64_t>(row.size());
      for (const auto& v : row) logits.push_back(v.get<float>());
    }
    logits.resize(static_cast<std::size_t>(m.batch * m.seq * vocab));
    out["loss"] = weighted_cross_entropy(logits, vocab, m);
  }
  return out;
}

json sample(const json& q) {
  const auto A = q["A"].get<std::vector<std::vector<float>>>();
  const auto B = q["B"].get<std::vector<std::vector<float>>>();
  const auto C = q["C"].get<std::vector<std::vector<float>>>();
  const auto vocab = static_cast<std::int64_t>(A[0].size());
  LogitsFn model = [&](const SequenceBatch& b, std::vector<float>& logits) {
    logits.assign(static_cast<std::size_t>(b.rows * b.len * vocab), 0.0f);
    for (std::int64_t r = 0; r < b.rows; ++r) {
      std::int64_t sum = 0;
      for (std::int64_t j = 0; j < b.len; ++j)
        if (b.attention[static_cast<std::size_t>(r * b.len + j)]) sum += b.ids[static_cast<std::size_t>(r * b.len + j)];
      const auto& c = C[static_cast<std::size_t>(sum % static_cast<std::int64_t>(C.size()))];
      for (std::int64_t j = 0; j < b.len; ++j) {
        const auto i = static_cast<std::size_t>(r * b.len + j);
        const auto& a = A[static_cast<std::size_t>(b.ids[i])];
        const auto& p = B[static_cast<std::size_t>(b.position_ids[i])];
        for (std::int64_t v = 0; v < vocab; ++v)
          logits[i * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(v)] =
              (a[static_cast<std::size_t>(v)] + p[static_cast<std::size_t>(v)]) + c[static_cast<std::size_t>(v)];
      }
    }
  };
  const auto prompts = q["prompts"].get<std::vector<std::vector<std::int32_t>>>();
  std::optional<std::int32_t> eos;
  if (q.contains("eos")) eos = q["eos"].get<std::int32_t>();
  if (q["op"] == "diffusion") {
    DiffusionSamplingOptions o;
    o.gen_length = q["gen_length"];
    o.steps = q["steps"];
    o.block_length = q["block_length"];
    o.temperature = q["temperature"];
    o.top_p = q.value("top_p", 1.0);
    o.cfg_scale = q.value("cfg", 0.0);
    o.remasking = parse_remasking(q["remasking"]);
    o.mask_token = q["mask"];
    o.eos = eos;
    o.seed = q["seed"];
    return {{"out", diffusion_generate(model, vocab, prompts, o)}};
  }
  ArSamplingOptions o;
  o.max_new_tokens = q["max_new_tokens"];
  o.temperature = q["temperature"];
  o.top_k = q.value("top_k", 0);
  o.top_p = q.value("top_p", 1.0);
  o.eos = eos;
  o.seed = q["seed"];
  return {{"out", ar_generate(model, vocab, prompts, o)}};
}

}  // namespace

int main() {
  try {
    json q = json::parse(std::cin);
    json a;
    if (q["op"] == "lr") a = lr(q);
    else if (q["op"] == "adamw") a = adamw(q);
    else if (q["op"] == "objective") a = objective(q);
    else if (q["op"] == "varilen") {
      json lengths = json::array();
      for (const auto& seed : q["seeds"])
        lengths.push_back(variable_length(q["prob"], seed.get<std::uint64_t>(), q["length"]));
      a = {{"lengths", lengths}};
    } else if (q["op"] == "tensorboard") {
      TensorBoardWriter tb(q["dir"].get<std::string>());
      for (const auto& e : q["events"]) tb.add_scalars(e[0].get<std::int64_t>(), e[1].get<std::map<std::string, double>>());
      a = {{"path", tb.path()}};
    }
    else a = sample(q);
    std::cout << a.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "train_host_tool: " << e.what() << "\n";
    return 1;
  }
}
