#include "tokenizer_flags.h"

namespace dlm::tools {

void add_tokenizer_flags(boost::program_options::options_description& opts, data::TokenizerOptions& t,
                         const TokenizerFlagDefaults& defaults) {
  namespace po = boost::program_options;
  auto* type = po::value(&t.type);
  if (!defaults.type.empty()) type->default_value(defaults.type);
  auto* model = po::value(&t.model);
  if (defaults.model_required) model->required();
  opts.add_options()
      ("tokenizer-type", type, "HuggingFaceTokenizer, GPT2BPETokenizer, TikTokenizer, SentencePieceTokenizer, "
                               "Llama2Tokenizer, NullTokenizer")
      ("tokenizer-model", model, "tokenizer.json (or its folder), .model, or tiktoken file")
      ("vocab-file", po::value(&t.vocab_file), "vocab.json (GPT2BPETokenizer)")
      ("merge-file", po::value(&t.merge_file), "merges.txt (GPT2BPETokenizer)")
      ("vocab-size", po::value<std::size_t>()->notifier([&t](std::size_t v) { t.vocab_size = v; }),
       "vocabulary size (NullTokenizer, TikTokenizer; dlm-train: the model's, default the tokenizer's)")
      ("tiktoken-pattern", po::value(&t.tiktoken_pattern), "v1 or v2 (TikTokenizer)")
      ("tiktoken-num-special-tokens", po::value(&t.tiktoken_num_special_tokens), "special ids (TikTokenizer)")
      ("tiktoken-special-tokens", po::value(&t.tiktoken_special_tokens)->multitoken(), "special tokens (TikTokenizer)")
      ("tokenizer-hf-include-special-tokens", po::bool_switch(&t.hf_include_special_tokens),
       "add the post-processor's bos/eos when encoding (HuggingFaceTokenizer; Megatron's default: no)");
}

}  // namespace dlm::tools
