// Encode throughput of one dlm tokenizer over a documents file (records: u32 byte length, bytes),
// with N threads taking documents in turn. Prints one JSON line: MB/s of the best of --repeat
// passes (and per second of process CPU time, steadier on a shared machine), the id count (which
// the Python side checks against the peers'), and for a SentencePiece model the encoder it took
// (--sentencepiece-library forces libsentencepiece's).
//
//   tokenize_bench --threads N --repeat R DOCS <tokenize_tool flags: --type ... --model ...>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "../../libdata/tokenize/kinds.h"
#include "dlm/data/tokenizer.h"

namespace {

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  dlm::data::TokenizerOptions o;
  int threads = 1, repeat = 3;
  bool sp_library = false;
  std::string docs_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--threads") threads = std::stoi(v), ++i;
    else if (a == "--repeat") repeat = std::stoi(v), ++i;
    else if (a == "--type") o.type = v, ++i;
    else if (a == "--model") o.model = v, ++i;
    else if (a == "--vocab-file") o.vocab_file = v, ++i;
    else if (a == "--merge-file") o.merge_file = v, ++i;
    else if (a == "--tiktoken-pattern") o.tiktoken_pattern = v, ++i;
    else if (a == "--sentencepiece-library") sp_library = true;
    else docs_path = a;
  }
  std::ifstream in(docs_path, std::ios::binary);
  std::vector<std::string> docs;
  std::size_t bytes = 0;
  std::uint32_t n;
  while (in.read(reinterpret_cast<char*>(&n), 4)) {
    docs.emplace_back(n, '\0');
    in.read(docs.back().data(), n);
    bytes += n;
  }
  const auto tokenizer = sp_library ? dlm::data::tok::make_sentencepiece_tokenizer(o, false) : dlm::data::make_tokenizer(o);
  double best = 1e30, best_cpu = 1e30;
  std::size_t ids = 0;
  for (int r = 0; r < repeat; ++r) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(threads));
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        std::vector<std::int32_t> out;
        for (std::size_t d = static_cast<std::size_t>(t); d < docs.size(); d += static_cast<std::size_t>(threads)) {
          out.clear();
          tokenizer->encode(docs[d], out);
          counts[static_cast<std::size_t>(t)] += out.size();
        }
      });
    for (auto& th : pool) th.join();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    best_cpu = std::min(best_cpu, static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    ids = 0;
    for (auto c : counts) ids += c;
  }
  std::cout << "{\"mb_per_s\": " << bytes / 1e6 / best << ", \"mb_per_cpu_s\": " << bytes / 1e6 / best_cpu
            << ", \"ids\": " << ids << ", \"bytes\": " << bytes
            << ", \"encoder\": \"" << json_escape(dlm::data::tok::sentencepiece_encoder(*tokenizer)) << "\"}\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "tokenize_bench: " << e.what() << "\n";
  return 1;
}
