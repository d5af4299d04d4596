// Tokenizer speed on one thread over the texts of a JSONL file (read and parsed before the clock starts).
// Prints "MB/s docs/s" for bench_preprocess.py, which multiplies it by the worker count as the pipeline's
// ceiling. usage: preprocess_tokenize_bench FILE.jsonl TOKENIZER_DIR [KEY]
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dlm/data/jsonl.h"
#include "dlm/data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fputs("usage: preprocess_tokenize_bench FILE.jsonl TOKENIZER_DIR [KEY]\n", stderr);
    return 2;
  }
  try {
    std::string key = argc > 3 ? argv[3] : "text";
    std::vector<std::string> texts;
    dlm::data::LineBlockReader reader({argv[1]}, 1 << 20);
    dlm::data::JsonFieldReader fields({key});
    dlm::data::LineBlock block;
    std::size_t bytes = 0;
    while (reader.next(block)) {
      std::size_t pos = 0;
      while (pos < block.used) {
        std::size_t end = pos;
        while (end < block.used && block.bytes[end] != '\n') ++end;
        std::string error = fields.read(block.bytes.data() + pos, end - pos);
        if (!error.empty()) throw std::runtime_error(error);
        for (auto part : fields.fields()[0].parts) texts.emplace_back(part);
        bytes += end - pos + 1;
        pos = end + 1;
      }
    }
    dlm::data::TokenizerOptions options;
    options.type = "HuggingFaceTokenizer";
    options.model = argv[2];
    auto tokenizer = dlm::data::make_tokenizer(options);
    std::vector<std::int32_t> ids;
    std::size_t tokens = 0;
    auto start = std::chrono::steady_clock::now();
    for (const auto& text : texts) {
      ids.clear();
      tokenizer->encode(text, ids);
      tokens += ids.size();
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // MB of JSONL input per second (the unit dlm-preprocess reports), documents per second, tokens.
    fmt::print("{:.3f} {:.1f} {}\n", bytes / 1e6 / seconds, texts.size() / seconds, tokens);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "preprocess_tokenize_bench: {}\n", e.what());
    return 1;
  }
}
