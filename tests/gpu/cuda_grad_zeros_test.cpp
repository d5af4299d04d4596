// --log-num-zeros-in-grad on the GPU (CudaModel::grad_zeros(), adamw.cu's zero count): the exact zeros of the
// gradients must be a host count of the same gradients downloaded, with the dense embedding gradient and with the
// sparse one (rows no token wrote are counted unread), right after zero_grad() (the GEMM-written gradients are left
// stale there and read as zeros), and close to the CPU backend's count of the same step on the same weights.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/cuda_model.h"
#include "dlm/train/model.h"
#include "gpu_test_util.h"

namespace dlm::train {
namespace {

std::int64_t zeros_of(const std::vector<float>& v) {
  std::int64_t n = 0;
  for (float x : v) n += x == 0.0f;
  return n;
}

// The host count over every tensor the model saves (all of them: a whole model).
std::int64_t downloaded_zeros(const CudaModel& m) {
  std::int64_t n = 0;
  for (const auto& t : m.tensors())
    if (t.saved) n += zeros_of(m.export_gradient(t.name));
  return n;
}

std::int64_t parameter_count(const CudaModel& m) {
  std::int64_t n = 0;
  for (const auto& t : m.tensors()) n += static_cast<std::int64_t>(m.export_gradient(t.name).size());
  return n;
}

TEST(CudaGradZeros, CountsTheDownloadedGradientsZeros) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  const auto c = gpu_test::small_config();  // untied: the embedding rows no token reads have zero gradients
  const std::int64_t batch = 2, seq = 64;
  std::mt19937 rng(23);
  // Labels from 30 of the 500 rows, half the positions masked (weight 0 elsewhere).
  const gpu_test::MaskedColumns x = gpu_test::masked_columns(rng, batch * seq, 40, 30, *c.mask_token_id, 0.02f);
  const CudaBatch b{batch, seq, false, x.ids, x.labels, {}, x.weights};
  for (const bool sparse : {false, true}) {
    const std::string what = sparse ? "sparse embedding gradient" : "dense embedding gradient";
    auto m = gpu_test::deterministic_model(c, 5);
    m->set_sparse_embedding_grad(sparse);
    gpu_test::CpuReference cpu(*m);
    const std::int64_t total = parameter_count(*m);
    m->forward_backward(b);
    cpu.forward_backward(b);
    const std::int64_t got = m->grad_zeros(), want = downloaded_zeros(*m);
    EXPECT_EQ(got, want) << what;
    // At least the embedding's unread rows, and far from everything.
    EXPECT_GT(got, (c.vocab_size - 31) * c.hidden_size) << what;
    EXPECT_LT(got, total / 2) << what;
    // fp32 against bf16 arithmetic: the zeros are the structural ones (rows and columns no token reaches), the same
    // on both; a value rounding to exactly zero on one side only is allowed for, rarely.
    std::int64_t on_cpu = 0;
    for (const auto& t : m->tensors()) on_cpu += zeros_of(cpu.model.export_gradient(t.name));
    EXPECT_NEAR(static_cast<double>(got), static_cast<double>(on_cpu), 1e-4 * static_cast<double>(total)) << what;
    std::printf("[grad zeros] %s: gpu %lld, downloaded %lld, cpu %lld of %lld\n", what.c_str(),
                static_cast<long long>(got), static_cast<long long>(want), static_cast<long long>(on_cpu),
                static_cast<long long>(total));
    // The optimizer step leaves the gradients as they were (it clips on the fly): the same count after it.
    AdamWOptions adam;
    m->adamw_step(adam, 1e-3, 0.05);
    EXPECT_EQ(m->grad_zeros(), got) << what << ": after AdamW";
    m->zero_grad();
    EXPECT_EQ(m->grad_zeros(), total) << what << ": after zero_grad";
  }
}

}  // namespace
}  // namespace dlm::train
