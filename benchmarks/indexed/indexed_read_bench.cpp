// Reader benchmark for libdata's IndexedDataset; benchmarks/indexed/bench_indexed.py runs it beside
// megatron-core's reader on the same files.
//   indexed_read_bench make PREFIX GB          synthetic uint16 dataset, log-normal document lengths
//   indexed_read_bench scan PREFIX             every sequence, tokens summed (so every byte is read)
//   indexed_read_bench random PREFIX N LEN     N random slices of LEN tokens (GPTDataset-style reads)
// Prints one line: "<mode> items=<n> tokens=<n> checksum=<n> seconds=<s>".
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dlm/data/indexed_dataset.h"

using namespace dlm::data;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int make(const std::string& prefix, double gigabytes) {
  std::mt19937_64 rng(1234);
  std::lognormal_distribution<double> length(6.5, 1.0);  // median ~665 tokens, long tail
  std::uniform_int_distribution<int> id(0, 50303);
  IndexedDatasetWriter w(prefix, DType::kUInt16);
  const double target_tokens = gigabytes * 1e9 / 2;
  std::vector<std::int32_t> doc;
  while (static_cast<double>(w.num_tokens()) < target_tokens) {
    doc.resize(1 + static_cast<std::size_t>(std::min(length(rng), 100000.0)));
    for (auto& t : doc) t = id(rng);
    w.add_item(doc);
    w.end_document();
  }
  w.finalize();
  std::printf("make documents=%zu tokens=%llu\n", w.num_documents(), static_cast<unsigned long long>(w.num_tokens()));
  return 0;
}

int scan(const std::string& prefix) {
  auto t0 = Clock::now();
  IndexedDataset ds(prefix);
  std::uint64_t checksum = 0, tokens = 0;
  for (std::size_t i = 0; i < ds.num_sequences(); ++i) {
    auto bytes = ds.sequence_bytes(i);
    const auto* p = reinterpret_cast<const std::uint16_t*>(bytes.data());
    std::size_t n = bytes.size() / 2;
    for (std::size_t k = 0; k < n; ++k) checksum += p[k];
    tokens += n;
  }
  std::printf("scan items=%zu tokens=%llu checksum=%llu seconds=%.4f\n", ds.num_sequences(),
              static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(checksum), since(t0));
  return 0;
}

int random_reads(const std::string& prefix, std::size_t count, std::size_t length) {
  IndexedDataset ds(prefix);
  // The same (sequence, offset) draws as the Python side: a fixed list read from a file would cost more
  // than the reads, so both sides use the same simple LCG.
  std::uint64_t state = 42;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  auto t0 = Clock::now();
  std::uint64_t checksum = 0, tokens = 0;
  std::vector<std::int32_t> out;
  for (std::size_t r = 0; r < count; ++r) {
    std::size_t i = next() % ds.num_sequences();
    auto len = static_cast<std::size_t>(ds.sequence_lengths()[i]);
    std::size_t take = std::min(length, len);
    std::size_t offset = (len - take) == 0 ? 0 : next() % (len - take + 1);
    out.clear();
    ds.read_sequence(i, out, offset, take);
    for (auto t : out) checksum += static_cast<std::uint64_t>(t);
    tokens += take;
  }
  std::printf("random items=%zu tokens=%llu checksum=%llu seconds=%.4f\n", count,
              static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(checksum), since(t0));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 2 ? argv[1] : "";
    if (mode == "make" && argc == 4) return make(argv[2], std::stod(argv[3]));
    if (mode == "scan" && argc == 3) return scan(argv[2]);
    if (mode == "random" && argc == 5) return random_reads(argv[2], std::stoul(argv[3]), std::stoul(argv[4]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "indexed_read_bench: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: indexed_read_bench make PREFIX GB | scan PREFIX | random PREFIX N LEN\n");
  return 2;
}
