// GPT2BPETokenizer: GPT-2's vocab.json + merges.txt, as transformers' GPT2TokenizerFast builds it
// for Megatron: byte-level BPE with GPT-2's pattern, no prefix space, and <|endoftext|> as the one
// special token (bos = eos = eod), matched in the text.
#include <fstream>
#include <nlohmann/json.hpp>

#include "dlm/common/error.h"
#include "hf_tokenizer.h"
#include "kinds.h"

namespace dlm::data::tok {

std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const TokenizerOptions& o) {
  if (o.vocab_file.empty() || o.merge_file.empty()) fail("GPT2BPETokenizer needs --vocab-file and --merge-file");
  using nlohmann::json;
  json vocab = read_json(o.vocab_file);
  if (!vocab.is_object()) fail_at(o.vocab_file, "expected an object of token -> id");
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    if (!it.value().is_number_integer()) fail_at(o.vocab_file, "\"" + it.key() + "\": expected an integer id");

  std::ifstream in(o.merge_file);
  if (!in) fail_errno(o.merge_file, "open", errno);
  json merges = json::array();
  std::string line;
  for (std::uint64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.starts_with("#version"))) continue;
    const auto sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      fail_at_line(o.merge_file, n, "expected two tokens separated by one space");
    const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
    for (const auto& t : {a, b, a + b})
      if (!vocab.contains(t)) fail_at_line(o.merge_file, n, "token \"" + t + "\" is not in " + o.vocab_file);
    merges.push_back(json::array({a, b}));
  }

  json j;
  j["model"] = {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}};
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  const bool has_eot = j["model"]["vocab"].contains("<|endoftext|>");
  if (has_eot) {
    j["added_tokens"] = json::array({{{"id", j["model"]["vocab"]["<|endoftext|>"]},
                                      {"content", "<|endoftext|>"},
                                      {"special", true},
                                      {"normalized", false}}});
  }
  HfConfig c = hf_config_from_json(j, o.vocab_file);
  if (has_eot) {
    const std::int32_t eot = j["model"]["vocab"]["<|endoftext|>"].get<std::int32_t>();
    c.special.eod = c.special.eos = c.special.bos = eot;
  }
  return std::make_unique<HuggingFaceTokenizer>(std::move(c), false, "GPT2BPETokenizer");
}

}  // namespace dlm::data::tok
