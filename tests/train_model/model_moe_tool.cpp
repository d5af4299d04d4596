// Test driver for interop_hf_moe.py: loads a Hugging Face Qwen3MoeForCausalLM folder through libckpt, runs one
// causal training step of dlm's CPU Model (mean cross-entropy over the labels >= 0, plus each MoE layer's aux
// and z loss) and writes what the script compares with transformers:
//   model_moe_tool HF_DIR OUT_DIR Z_LOSS_COEFF < {"ids": [[...]...], "labels": [[...]...]}
//   stdout: {"vocab", "loss" (cross-entropy), "logits" [[vocab floats] per token], "moe": [{"layer", "aux_loss",
//            "z_loss", "tokens_per_expert", "aux_probability_sum"}]}
//   OUT_DIR/grads:     every parameter's gradient as an HF folder (HF names and layout)
//   OUT_DIR/roundtrip: the imported weights exported again (dlm-ckpt convert --to hf's path)
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "dlm/ckpt/hf.h"
#include "dlm/train/model.h"

using json = nlohmann::json;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: model_moe_tool HF_DIR OUT_DIR Z_LOSS_COEFF < request.json\n");
    return 2;
  }
  try {
    dlm::ckpt::HfModel hf = dlm::ckpt::load_hf_folder(argv[1]);
    const std::string out_dir = argv[2];
    hf.config.moe_z_loss_coeff = std::stod(argv[3]);
    auto backend = dlm::train::make_cpu_backend(2);
    dlm::train::Model model(hf.config, *backend);
    model.import_weights(hf.tensors);

    const json request = json::parse(std::cin);
    const auto rows = request["ids"].get<std::vector<std::vector<std::int32_t>>>();
    const auto label_rows = request["labels"].get<std::vector<std::vector<std::int32_t>>>();
    std::vector<std::int32_t> ids, labels;
    for (const auto& r : rows) ids.insert(ids.end(), r.begin(), r.end());
    for (const auto& r : label_rows) labels.insert(labels.end(), r.begin(), r.end());
    dlm::train::ModelInput in;
    in.batch = static_cast<std::int64_t>(rows.size());
    in.seq = static_cast<std::int64_t>(rows.at(0).size());
    in.ids = ids;
    in.attention = dlm::train::AttentionKind::kCausal;
    const dlm::train::Tensor& logits = model.forward(in);
    std::vector<float> host(static_cast<std::size_t>(logits.numel()));
    backend->copy_to_host(logits, host);
    const std::vector<float> ce = model.cross_entropy(labels);
    double count = 0, loss = 0;
    for (std::size_t i = 0; i < labels.size(); ++i)
      if (labels[i] >= 0) count += 1, loss += ce[i];
    std::vector<float> weights(labels.size());
    for (std::size_t i = 0; i < labels.size(); ++i) weights[i] = labels[i] >= 0 ? static_cast<float>(1 / count) : 0.0f;
    model.backward(weights);

    const std::int64_t vocab = hf.config.vocab_size, padded = hf.config.padded_vocab_size();
    json out = {{"vocab", vocab}, {"loss", loss / count}};
    json& rows_out = out["logits"] = json::array();
    for (std::int64_t t = 0; t < in.batch * in.seq; ++t)
      rows_out.push_back(std::vector<float>(host.begin() + t * padded, host.begin() + t * padded + vocab));
    json& moe = out["moe"] = json::array();
    for (const auto& s : model.moe_stats())
      moe.push_back({{"layer", s.layer}, {"aux_loss", s.aux_loss}, {"z_loss", s.z_loss},
                     {"tokens_per_expert", s.tokens_per_expert}, {"aux_probability_sum", s.aux_probability_sum}});
    dlm::ckpt::TensorSet grads;
    for (const auto& p : model.parameters()) {
      dlm::ckpt::Tensor t = dlm::ckpt::Tensor::zeros(p.spec.name, p.spec.shape);
      backend->copy_to_host(p.grad, t.f32());
      grads.emplace(p.spec.name, std::move(t));
    }
    dlm::ckpt::export_hf_folder(out_dir + "/grads", hf.config, grads);
    dlm::ckpt::export_hf_folder(out_dir + "/roundtrip", hf.config, model.export_weights());
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_moe_tool: %s\n", e.what());
    return 1;
  }
}
