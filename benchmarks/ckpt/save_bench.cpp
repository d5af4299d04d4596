// The trainer's checkpoint save (weights + AdamW moments, from the training state as dlm-train holds it) beside
// the disk's own O_DIRECT write rate, in one run: `dd if=/dev/zero bs=64M oflag=direct conv=fsync` of the same
// bytes in the same folder. Prints both rates and save / dd. With --async, also the time a save blocks the
// caller (the snapshot) and the time until its background commit.
//   save_bench DIR [--gb 4 | --layers N] [--hidden 2048] [--ffn 6144] [--vocab 50304] [--async] [--repeat 1]
// The model is MegaDLMs' 1.7B per layer (16 heads, 16 KV groups, QK-norm, untied output layer); the layer count is
// --layers (28: the 1.7B itself, 20.8 GB of state) or chosen so the state is about --gb GB.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dlm/ckpt/checkpoint.h"
#include "dlm/train/checkpoint_saver.h"
#include "dlm/train/optimizer.h"
#include "dlm/train/trainer.h"

namespace fs = std::filesystem;
using namespace dlm;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A model whose parameters are plain host vectors (the CPU backend's view).
class HostModel final : public train::TrainableModel {
 public:
  explicit HostModel(const ckpt::ModelConfig& c) {
    for (const auto& s : ckpt::model_tensors(c)) {
      values_.emplace_back(static_cast<std::size_t>(ckpt::element_count(s.shape)));
      auto& v = values_.back();
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1021) * 1e-3f;
      refs_.push_back({s.name, v, {}, !s.is_norm, s.shape});
    }
  }
  std::vector<train::ParamRef> parameters() override { return refs_; }
  void zero_grad() override {}
  double forward_backward(const train::ModelBatch&) override { return 0; }
  double forward_loss(const train::ModelBatch&) override { return 0; }

 private:
  std::vector<std::vector<float>> values_;
  std::vector<train::ParamRef> refs_;
};

double dd_direct(const fs::path& dir, std::int64_t bytes) {
  const std::int64_t blocks = std::max<std::int64_t>(1, (bytes + (64 << 20) - 1) / (64 << 20));
  const fs::path out = dir / "dd.bin";
  const std::string cmd = fmt::format("dd if=/dev/zero of={} bs=64M count={} oflag=direct conv=fsync status=none",
                                      out.string(), blocks);
  const auto t0 = std::chrono::steady_clock::now();
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "save_bench: %s failed\n", cmd.c_str());
    std::exit(1);
  }
  const double s = seconds_since(t0);
  fs::remove(out);
  return static_cast<double>(blocks) * (64 << 20) / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: save_bench DIR [--gb 4 | --layers N] [--hidden 2048] [--ffn 6144] [--vocab 50304] [--async] [--repeat 1]\n");
    return 2;
  }
  const fs::path dir = argv[1];
  double gb = 4;
  int hidden = 2048, ffn = 6144, vocab = 50304, repeat = 1, layers = 0;
  bool async = false;
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--async") {
      async = true;
      continue;
    }
    if (i + 1 >= argc) return 2;
    const char* v = argv[++i];
    if (k == "--gb") gb = std::atof(v);
    else if (k == "--hidden") hidden = std::atoi(v);
    else if (k == "--ffn") ffn = std::atoi(v);
    else if (k == "--vocab") vocab = std::atoi(v);
    else if (k == "--repeat") repeat = std::atoi(v);
    else if (k == "--layers") layers = std::atoi(v);
    else return 2;
  }
  ckpt::ModelConfig c;
  c.hidden_size = hidden;
  c.ffn_hidden_size = ffn;
  c.num_attention_heads = 16;
  c.num_query_groups = 16;
  c.kv_channels = 128;
  c.vocab_size = vocab;
  c.qk_layernorm = true;
  c.tie_word_embeddings = false;
  c.num_layers = std::max(layers, 1);
  const auto state_bytes = [&] {
    std::int64_t n = 0;
    for (const auto& s : ckpt::model_tensors(c)) n += ckpt::element_count(s.shape);
    return n * 12;
  };
  while (layers == 0 && static_cast<double>(state_bytes()) < gb * 1e9) ++c.num_layers;
  const std::int64_t bytes = state_bytes();

  HostModel model(c);
  train::AdamW adam({});
  for (const auto& p : model.parameters()) {
    adam.exp_avg().emplace_back(p.value.begin(), p.value.end());
    adam.exp_avg_sq().emplace_back(p.value.begin(), p.value.end());
  }
  adam.set_steps(1);
  fs::remove_all(dir);
  fs::create_directories(dir);
  train::CheckpointTarget target;
  target.dir = (dir / "ckpt").string();
  target.config = c;
  target.async = async;
  train::CheckpointSaver saver(target);
  double save_s = 0, blocked_s = 0;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    saver({r + 1, r + 1}, model, adam);
    blocked_s += seconds_since(t0);
    saver.wait();
    save_s += seconds_since(t0);
  }
  save_s /= repeat;
  blocked_s /= repeat;
  const double save_gbps = static_cast<double>(bytes) / save_s / 1e9;
  fs::remove_all(dir / "ckpt");
  const double dd = dd_direct(dir, bytes);
  std::printf("layers %d state_bytes %lld save_s %.3f save_gbps %.3f blocked_s %.3f dd_direct_gbps %.3f ratio %.3f\n",
              c.num_layers, static_cast<long long>(bytes), save_s, save_gbps, blocked_s, dd, save_gbps / dd);
  fs::remove_all(dir);
  return 0;
}
