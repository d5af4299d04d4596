// The gradient norm's layer parts taken in the backward (CudaModel::take_norm_in_next_backward, layer_norm_sums.h):
// the norm is the same bits as the one pass over every gradient, on a dense and an MoE model (its experts' tensors
// span several chunks), asked twice, and after a second backward or zero_grad() undid the parts; and the parts are
// those of the backward (a layer gradient written after it is not read again, which is why a caller whose
// gradients change after the backward must not ask for them).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <random>
#include <string>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/train/cuda_model.h"
#include "gpu_test_util.h"

namespace dlm::train {
namespace {

ckpt::ModelConfig moe_config() {
  auto c = gpu_test::small_config();
  c.num_experts = 8, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 64;
  c.moe_shared_expert_intermediate_size = 32;
  return c;
}

struct Case {
  const char* name;
  ckpt::ModelConfig config;
};

TEST(CudaGradNorm, TakenByLayerInTheBackwardIsTheSameBits) {
  if (!gpu_test::have_device()) GTEST_SKIP() << "no CUDA device";
  for (const Case& k : {Case{"dense", gpu_test::small_config()}, Case{"moe", moe_config()}}) {
    const auto& c = k.config;
    const std::int64_t batch = 2, seq = 64;
    std::mt19937 rng(31);
    const auto x = gpu_test::masked_columns(rng, batch * seq, 40, 300, *c.mask_token_id, 0.02f);
    const auto y = gpu_test::masked_columns(rng, batch * seq, 40, 300, *c.mask_token_id, 0.02f);
    const CudaBatch bx{batch, seq, false, x.ids, x.labels, {}, x.weights};
    const CudaBatch by{batch, seq, false, y.ids, y.labels, {}, y.weights};
    auto whole = gpu_test::deterministic_model(c, 5), parts = gpu_test::deterministic_model(c, 5);

    // One micro-batch: the parts taken in its backward.
    whole->forward_backward(bx);
    parts->take_norm_in_next_backward();
    parts->forward_backward(bx);
    const double want = whole->grad_norm();
    EXPECT_GT(want, 0.0) << k.name;
    EXPECT_EQ(parts->grad_norm(), want) << k.name;
    EXPECT_EQ(parts->grad_norm(), want) << k.name << ": asked again";
    // The step clips by the same sum and returns the same norm.
    AdamWOptions adam;
    EXPECT_EQ(parts->adamw_step(adam, 1e-3, 0.01 * want), whole->adamw_step(adam, 1e-3, 0.01 * want)) << k.name;
    whole->zero_grad(), parts->zero_grad();

    // Asked before the first of two micro-batches: the second backward undoes the parts.
    parts->take_norm_in_next_backward();
    for (auto* m : {whole.get(), parts.get()}) m->forward_backward(bx), m->forward_backward(by);
    EXPECT_EQ(parts->grad_norm(), whole->grad_norm()) << k.name << ": two micro-batches";
    // zero_grad() undoes them too.
    parts->take_norm_in_next_backward();
    parts->forward_backward(bx);
    whole->zero_grad(), parts->zero_grad();
    for (auto* m : {whole.get(), parts.get()}) m->forward_backward(by);
    EXPECT_EQ(parts->grad_norm(), whole->grad_norm()) << k.name << ": after zero_grad";
    whole->zero_grad(), parts->zero_grad();

    // The parts are the backward's: the first layer's QKV gradient zeroed after it counts as it was.
    parts->take_norm_in_next_backward();
    for (auto* m : {whole.get(), parts.get()}) m->forward_backward(bx);
    const double before = whole->grad_norm();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the side stream's parts too: the write below comes after them
    for (auto* m : {whole.get(), parts.get()})
      for (const auto& g : m->gradient_buffers())
        if (g.name == "decoder.layers.0.self_attention.linear_qkv.weight") {
          ASSERT_EQ(cudaMemsetAsync(g.data, 0, sizeof(float) * g.numel, static_cast<cudaStream_t>(m->stream())),
                    cudaSuccess);
        }
    EXPECT_LT(whole->grad_norm(), before) << k.name;
    EXPECT_EQ(parts->grad_norm(), before) << k.name << ": the layer's part was taken in the backward";
    whole->zero_grad(), parts->zero_grad();
  }
}

}  // namespace
}  // namespace dlm::train
