// A driver the Python interop tests call: builds a tokenizer from Megatron-style flags and encodes,
// decodes or describes. Documents travel as records (u32 little-endian byte length, bytes); id lists
// as (u32 count, int32 ids).
//
//   tokenize_tool [--type T] [--model M] [--vocab-file F] [--merge-file F] [--tiktoken-pattern P]
//                 [--vocab-size N] [--include-special] [--threads N] [--sentencepiece-library]
//                 encode|decode|info [IN OUT]
// --sentencepiece-library keeps a SentencePiece model's encodes and decodes in libsentencepiece; `info`
// says which encoder and decoder a SentencePiece model takes ("encoder", "decoder").
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "dlm/common/error.h"
#include "dlm/data/tokenizer.h"
#include "../../libdata/tokenize/kinds.h"

namespace {

std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> out;
  std::uint32_t n;
  while (in.read(reinterpret_cast<char*>(&n), 4)) {
    std::string s(n, '\0');
    in.read(s.data(), n);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::vector<std::int32_t>> read_ids(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::vector<std::int32_t>> out;
  std::uint32_t n;
  while (in.read(reinterpret_cast<char*>(&n), 4)) {
    std::vector<std::int32_t> ids(n);
    in.read(reinterpret_cast<char*>(ids.data()), 4 * static_cast<std::streamsize>(n));
    out.push_back(std::move(ids));
  }
  return out;
}

void put_optional(nlohmann::json& j, const char* key, const std::optional<std::int32_t>& v) {
  j[key] = v ? nlohmann::json(*v) : nlohmann::json();
}

}  // namespace

int main(int argc, char** argv) try {
  dlm::data::TokenizerOptions o;
  int threads = 1;
  bool sp_library = false;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--type") o.type = value();
    else if (a == "--model") o.model = value();
    else if (a == "--vocab-file") o.vocab_file = value();
    else if (a == "--merge-file") o.merge_file = value();
    else if (a == "--tiktoken-pattern") o.tiktoken_pattern = value();
    else if (a == "--vocab-size") o.vocab_size = std::stoul(value());
    else if (a == "--include-special") o.hf_include_special_tokens = true;
    else if (a == "--threads") threads = std::stoi(value());
    else if (a == "--sentencepiece-library") sp_library = true;
    else rest.push_back(a);
  }
  const auto tokenizer = sp_library ? dlm::data::tok::make_sentencepiece_tokenizer(o, false) : dlm::data::make_tokenizer(o);
  if (rest.empty() || rest[0] == "info") {
    const auto& s = tokenizer->special_ids();
    nlohmann::json j;
    j["kind"] = tokenizer->kind();
    j["vocab_size"] = tokenizer->vocab_size();
    put_optional(j, "eod", s.eod);
    put_optional(j, "bos", s.bos);
    put_optional(j, "eos", s.eos);
    put_optional(j, "pad", s.pad);
    put_optional(j, "mask", s.mask);
    if (const auto e = dlm::data::tok::sentencepiece_encoder(*tokenizer); !e.empty()) j["encoder"] = e;
    if (const auto d = dlm::data::tok::sentencepiece_decoder(*tokenizer); !d.empty()) j["decoder"] = d;
    std::cout << j.dump() << "\n";
    return 0;
  }
  if (rest.size() != 3) throw std::runtime_error("usage: ... encode|decode IN OUT");
  std::ofstream out(rest[2], std::ios::binary);
  if (rest[0] == "encode") {
    const auto docs = read_records(rest[1]);
    std::vector<std::vector<std::int32_t>> ids(docs.size());
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (std::size_t d = static_cast<std::size_t>(t); d < docs.size(); d += static_cast<std::size_t>(threads))
          tokenizer->encode(docs[d], ids[d]);
      });
    for (auto& th : pool) th.join();
    for (const auto& v : ids) {
      const auto n = static_cast<std::uint32_t>(v.size());
      out.write(reinterpret_cast<const char*>(&n), 4);
      out.write(reinterpret_cast<const char*>(v.data()), 4 * static_cast<std::streamsize>(n));
    }
  } else if (rest[0] == "decode") {
    for (const auto& v : read_ids(rest[1])) {
      const std::string s = tokenizer->decode(v);
      const auto n = static_cast<std::uint32_t>(s.size());
      out.write(reinterpret_cast<const char*>(&n), 4);
      out.write(s.data(), n);
    }
  } else {
    throw std::runtime_error("unknown command " + rest[0]);
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "tokenize_tool: " << e.what() << "\n";
  return 1;
}
