// Megatron's --tokenizer-* flags, shared by `dlm-preprocess` and `dlm-preprocess inspect`.
#pragma once

#include <boost/program_options.hpp>

#include "dlm/data/tokenizer.h"

namespace dlm::tools {

inline void add_tokenizer_flags(boost::program_options::options_description& opts, data::TokenizerOptions& t) {
  namespace po = boost::program_options;
  opts.add_options()
      ("tokenizer-type", po::value(&t.type), "HuggingFaceTokenizer, GPT2BPETokenizer, TikTokenizer, "
                                             "SentencePieceTokenizer, Llama2Tokenizer, NullTokenizer")
      ("tokenizer-model", po::value(&t.model), "tokenizer.json (or its folder), .model, or tiktoken file")
      ("vocab-file", po::value(&t.vocab_file), "vocab.json (GPT2BPETokenizer)")
      ("merge-file", po::value(&t.merge_file), "merges.txt (GPT2BPETokenizer)")
      ("vocab-size", po::value<std::size_t>()->notifier([&t](std::size_t v) { t.vocab_size = v; }),
       "vocabulary size (NullTokenizer)")
      ("tiktoken-pattern", po::value(&t.tiktoken_pattern), "v1 or v2 (TikTokenizer)")
      ("tiktoken-num-special-tokens", po::value(&t.tiktoken_num_special_tokens), "special ids (TikTokenizer)")
      ("tiktoken-special-tokens", po::value(&t.tiktoken_special_tokens)->multitoken(), "special tokens (TikTokenizer)");
}

}  // namespace dlm::tools
