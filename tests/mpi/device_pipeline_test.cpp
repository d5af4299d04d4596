// The GPU pipeline schedule (device_pipeline.h) on CPUs: host-memory stages over the staged group (MPI), with
// messages large enough to need their receiver (a send that is not met blocks, as NCCL's does), so a
// mis-paired transfer deadlocks and the communicator's timeout fails the test. Each stage checks what it
// receives: micro-batch mb's activations at stage r are the first stage's values after r known maps, its
// gradients the last stage's after the inverse chain, and a backward finds the input its forward kept in
// the same slot. The order of work must be pipeline_order()'s.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dlm/train/device_pipeline.h"
#include "dlm/train/parallel.h"
#include "dlm/train/pipeline_schedule.h"
#include "mpi_test_main.h"

namespace dlm::train {
namespace {

using test::mpi_world;

constexpr std::size_t kElements = 1 << 15;  // 64 KiB of bf16, 128 KiB of fp32: beyond MPI's eager sizes

// Stage r maps its input x to 3x + r + 1 (16-bit arithmetic: the activations travel as bf16-sized words).
std::vector<std::uint16_t> activations(int mb, int stage) {
  std::vector<std::uint16_t> x(kElements);
  for (std::size_t i = 0; i < kElements; ++i) x[i] = static_cast<std::uint16_t>(mb * 1000 + i);
  for (int s = 0; s < stage; ++s)
    for (auto& v : x) v = static_cast<std::uint16_t>(3 * v + s + 1);
  return x;
}
// The gradient leaving stage r backwards: the last stage sends mb + 1, each earlier one 2g + r.
float input_gradient(int mb, int stage, int stages) {
  float g = static_cast<float>(mb + 1);
  for (int s = stages - 2; s >= stage; --s) g = 2 * g + static_cast<float>(s);
  return g;
}

class FakeStage final : public PipelineStage {
 public:
  FakeStage(int rank, int stages) : r_(rank), P_(stages), out_(kElements), grad_out_(kElements), grad_in_(kElements) {}
  std::size_t boundary_elements() const override { return kElements; }
  void* input(int slot) override { return slot_data(slot).data(); }
  const void* output() const override { return out_.data(); }
  float* output_grad() override { return grad_out_.data(); }
  const float* input_grad() const override { return grad_in_.data(); }
  void* stream() override { return nullptr; }

  void forward(int mb, int slot, bool training) override {
    order.push_back({true, 0, mb});
    auto& x = slot_data(slot);
    if (r_ == 0) x = activations(mb, 0);
    if (x != activations(mb, r_)) ++wrong_inputs;
    for (std::size_t i = 0; i < kElements; ++i) out_[i] = static_cast<std::uint16_t>(3 * x[i] + r_ + 1);
    if (r_ == P_ - 1) loss += static_cast<double>(mb + 1) * (training ? 1 : 10);
  }
  void backward(int mb, int slot) override {
    order.push_back({false, 0, mb});
    if (slot_data(slot) != activations(mb, r_)) ++wrong_slots;
    float g = static_cast<float>(mb + 1);
    if (r_ < P_ - 1) {
      const float want = input_gradient(mb, r_ + 1, P_);
      for (float v : grad_out_) wrong_gradients += v != want;
      g = 2 * grad_out_[0] + static_cast<float>(r_);
    }
    std::fill(grad_in_.begin(), grad_in_.end(), g);
    if (r_ == 0 && g != input_gradient(mb, 0, P_)) ++wrong_gradients;
  }

  std::vector<PipelineUnit> order;
  int wrong_inputs = 0, wrong_slots = 0, wrong_gradients = 0;
  double loss = 0;

 private:
  std::vector<std::uint16_t>& slot_data(int slot) {
    while (static_cast<int>(slots_.size()) <= slot) slots_.emplace_back(kElements);
    return slots_[static_cast<std::size_t>(slot)];
  }
  int r_, P_;
  std::vector<std::vector<std::uint16_t>> slots_;
  std::vector<std::uint16_t> out_;
  std::vector<float> grad_out_, grad_in_;
};

void run_layout(int pipeline_size, int micro_batches, bool training) {
  ASSERT_EQ(mpi_world().size(), 4);
  ProcessGroups groups = make_process_groups(mpi_world(), derive_parallel_config(4, 1, pipeline_size));
  auto group = host_device_group(*groups.pipeline);
  const int r = groups.pipeline->rank(), P = groups.pipeline->size();
  FakeStage stage(r, P);
  const int held = run_pipeline_1f1b(stage, group.get(), micro_batches, training);
  const std::string what = fmt::format("PP{} M={} {} rank {}", P, micro_batches, training ? "1F1B" : "forward", r);
  EXPECT_EQ(stage.wrong_inputs, 0) << what;
  EXPECT_EQ(stage.wrong_slots, 0) << what;
  EXPECT_EQ(stage.wrong_gradients, 0) << what;
  std::vector<PipelineUnit> want;
  for (const PipelineUnit& u : pipeline_order(P, r, 1, micro_batches))
    if (training || u.forward) want.push_back(u);
  ASSERT_EQ(stage.order.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(stage.order[i].forward, want[i].forward) << what << " unit " << i;
    EXPECT_EQ(stage.order[i].micro_batch, want[i].micro_batch) << what << " unit " << i;
  }
  if (training) {
    EXPECT_EQ(held, std::min(P - r, micro_batches)) << what;  // 1F1B's bound, reached
  }
  const double loss = stage.loss;
  const double expected = r == P - 1 ? micro_batches * (micro_batches + 1) / 2.0 * (training ? 1 : 10) : 0.0;
  EXPECT_EQ(loss, expected) << what;
}

TEST(DevicePipeline, FourStagesPairTheirTransfers) {
  for (int m : {1, 3, 4, 9}) run_layout(4, m, true);
}
TEST(DevicePipeline, TwoStagesTimesTwoReplicas) {
  for (int m : {1, 2, 5}) run_layout(2, m, true);
}
TEST(DevicePipeline, ForwardOnly) {
  run_layout(4, 5, false);
  run_layout(2, 3, false);
}

}  // namespace
}  // namespace dlm::train
