// Test driver for interop_hf_logits.py: loads a Hugging Face model folder through libckpt's import,
// runs dlm's Model on the CPU backend and prints the logits.
//   model_logits_tool HF_DIR causal|bidirectional  < {"ids": [[...]...], "attention": [[...]...] (optional)}
//   -> {"vocab": V, "padded_vocab": P, "logits": [[V floats] per token, row-major over batch, seq]}
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "dlm/ckpt/hf.h"
#include "dlm/train/model.h"

using json = nlohmann::json;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: model_logits_tool HF_DIR causal|bidirectional < request.json\n");
    return 2;
  }
  try {
    dlm::ckpt::HfModel hf = dlm::ckpt::load_hf_folder(argv[1]);
    const std::string mode = argv[2];
    hf.config.attention_mask =
        mode == "causal" ? dlm::ckpt::AttentionMask::kCausal : dlm::ckpt::AttentionMask::kBidirectional;
    auto backend = dlm::train::make_cpu_backend(2);
    dlm::train::Model model(hf.config, *backend);
    model.import_weights(hf.tensors);

    const json request = json::parse(std::cin);
    const auto rows = request["ids"].get<std::vector<std::vector<std::int32_t>>>();
    std::vector<std::int32_t> ids;
    std::vector<std::uint8_t> attention;
    std::vector<std::int32_t> positions;
    for (const auto& r : rows) ids.insert(ids.end(), r.begin(), r.end());
    if (request.contains("attention")) {
      // HF's convention for left padding: positions = cumsum(attention) - 1, padding at 0.
      for (const auto& r : request["attention"].get<std::vector<std::vector<std::uint8_t>>>()) {
        std::int32_t p = 0;
        for (auto a : r) {
          attention.push_back(a);
          positions.push_back(a ? p++ : 0);
        }
      }
    }
    dlm::train::ModelInput in;
    in.batch = static_cast<std::int64_t>(rows.size());
    in.seq = static_cast<std::int64_t>(rows.at(0).size());
    in.ids = ids;
    in.key_valid = attention;
    in.positions = positions;
    in.attention = model.default_attention();
    const dlm::train::Tensor& logits = model.forward(in);
    std::vector<float> host(static_cast<std::size_t>(logits.numel()));
    backend->copy_to_host(logits, host);
    const std::int64_t vocab = hf.config.vocab_size, padded = hf.config.padded_vocab_size();
    json out = {{"vocab", vocab}, {"padded_vocab", padded}};
    json& rows_out = out["logits"] = json::array();
    for (std::int64_t t = 0; t < in.batch * in.seq; ++t)
      rows_out.push_back(std::vector<float>(host.begin() + t * padded, host.begin() + t * padded + vocab));
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_logits_tool: %s\n", e.what());
    return 1;
  }
}
