// Helpers shared by the checkpoint tests: a fresh temporary folder per test and random models.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dlm/ckpt/hf.h"
#include "dlm/ckpt/model_config.h"
#include "dlm/ckpt/tensor.h"

namespace dlm::ckpt::test {

// Removes every folder fresh_dir() made when the test program ends.
class TempDirs : public ::testing::Environment {
 public:
  std::vector<std::filesystem::path> dirs;
  void TearDown() override {
    for (const auto& d : dirs) std::filesystem::remove_all(d);
  }
};
inline TempDirs* const temp_dirs = static_cast<TempDirs*>(::testing::AddGlobalTestEnvironment(new TempDirs));

inline std::filesystem::path fresh_dir(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("dlm_ckpt_" + tag + "_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  temp_dirs->dirs.push_back(dir);
  return dir;
}

// A small GQA model with q/k norms and an unpadded vocabulary (300 -> 384 rows).
inline ModelConfig small_config(bool qk_norm = true, bool tied = false) {
  ModelConfig c;
  c.num_layers = 3;
  c.hidden_size = 32;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 8;
  c.vocab_size = 300;
  c.qk_layernorm = qk_norm;
  c.tie_word_embeddings = tied;
  return c;
}

// Every global tensor filled with distinct random values; padding rows of the vocabulary zero.
inline TensorSet random_model(const ModelConfig& c, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  TensorSet s;
  for (const TensorSpec& spec : model_tensors(c)) {
    Tensor t = Tensor::zeros(spec.name, spec.shape);
    auto f = t.f32();
    const bool vocab = spec.shape.size() == 2 && spec.shape[0] == c.padded_vocab_size();
    const std::size_t live = vocab ? static_cast<std::size_t>(c.vocab_size * spec.shape[1]) : f.size();
    for (std::size_t i = 0; i < live; ++i) f[i] = normal(rng);
    s[spec.name] = std::move(t);
  }
  return s;
}

// A test with a fresh folder holding a small model exported as Hugging Face files, dir_ / "hf".
class SmallHfFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("hf_folder");
    config_ = small_config();
    export_hf_folder((dir_ / "hf").string(), config_, random_model(config_, 7));
  }
  std::filesystem::path dir_;
  ModelConfig config_;
};

}  // namespace dlm::ckpt::test
