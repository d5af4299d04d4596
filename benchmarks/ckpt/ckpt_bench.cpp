// Saves and loads a training state (fp32 weights + AdamW moments) with the native store and prints
// GB/s; bench_ckpt.py runs it beside `dd conv=fsync` and Python safetensors. Before the load every file
// of the checkpoint is dropped from the page cache (posix_fadvise DONTNEED after the fsync), so the load
// reads the disk.
//   ckpt_bench ROOT [--layers 24 --hidden 1024 --ffn 2816 --heads 16 --groups 16 --vocab 50304 --tp 1 --pp 1]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "dlm/ckpt/checkpoint.h"

using namespace dlm::ckpt;
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

void drop_from_cache(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ckpt_bench ROOT [--layers N --hidden H --ffn F --heads A --groups G --vocab V --tp T --pp P]\n");
    return 2;
  }
  const std::string root = argv[1];
  ModelConfig c;
  c.num_layers = 24;
  c.hidden_size = 1024;
  c.ffn_hidden_size = 2816;
  c.num_attention_heads = 16;
  c.num_query_groups = 16;
  c.kv_channels = 64;
  c.vocab_size = 50304;
  c.tie_word_embeddings = true;
  ParallelLayout layout;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--layers") c.num_layers = v;
    else if (k == "--hidden") c.hidden_size = v;
    else if (k == "--ffn") c.ffn_hidden_size = v;
    else if (k == "--heads") c.num_attention_heads = v;
    else if (k == "--groups") c.num_query_groups = v;
    else if (k == "--vocab") c.vocab_size = v;
    else if (k == "--tp") layout.tp = v;
    else if (k == "--pp") layout.pp = v;
  }
  c.kv_channels = c.hidden_size / c.num_attention_heads;
  // Every rank's local state, filled with a non-constant pattern (the checksum must do real work).
  std::vector<TrainingTensors> ranks;
  std::int64_t params = 0, bytes = 0;
  for (const TensorSpec& s : model_tensors(c)) params += element_count(s.shape);
  for (int pp = 0; pp < layout.pp; ++pp)
    for (int tp = 0; tp < layout.tp; ++tp) {
      TrainingTensors t;
      for (const TensorShard& s : rank_shards(c, layout, tp, pp)) {
        if (!s.saved) continue;
        for (TensorSet* set : {&t.params, &t.exp_avg, &t.exp_avg_sq}) {
          Tensor x = Tensor::zeros(s.name, s.local_shape);
          auto f = x.f32();
          for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i % 1021) * 1e-3f;
          bytes += static_cast<std::int64_t>(x.bytes.size());
          (*set)[s.name] = std::move(x);
        }
      }
      ranks.push_back(std::move(t));
    }
  fs::remove_all(root);
  auto t0 = std::chrono::steady_clock::now();
  CheckpointWriter w(root, 1, c, layout);
  w.begin();
  for (int pp = 0, r = 0; pp < layout.pp; ++pp)
    for (int tp = 0; tp < layout.tp; ++tp) w.write_rank(tp, pp, ranks[r++]);
  const std::string dir = w.commit({.iteration = 1});
  const double save_s = seconds_since(t0);
  ranks.clear();
  drop_from_cache(dir);
  t0 = std::chrono::steady_clock::now();
  CheckpointReader reader(root);
  std::int64_t loaded = 0;
  for (int pp = 0; pp < layout.pp; ++pp)
    for (int tp = 0; tp < layout.tp; ++tp) {
      const TrainingTensors t = reader.read_rank(layout, tp, pp);
      for (const TensorSet* set : {&t.params, &t.exp_avg, &t.exp_avg_sq})
        for (const auto& [n, x] : *set) loaded += static_cast<std::int64_t>(x.bytes.size());
    }
  const double load_s = seconds_since(t0);
  std::printf("params %lld state_bytes %lld save_s %.3f save_gbps %.3f load_s %.3f load_gbps %.3f loaded_bytes %lld\n",
              static_cast<long long>(params), static_cast<long long>(bytes), save_s, bytes / save_s / 1e9, load_s,
              loaded / load_s / 1e9, static_cast<long long>(loaded));
  fs::remove_all(root);
  return 0;
}
