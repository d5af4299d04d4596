// The GPU pipeline schedule (device_pipeline.h) on CPUs: host-memory stages over the staged group (MPI), with
// messages large enough to need their receiver (a send that is not met blocks, as NCCL's does), so a
// mis-paired transfer deadlocks and the communicator's timeout fails the test. Each stage checks what it
// receives: micro-batch mb's activations at stage r are the first stage's values after r known maps, its
// gradients the last stage's after the inverse chain, and a backward finds the input its forward kept in
// the same slot. The order of work must be pipeline_order()'s.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dlm/common/error.h"
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
  // Global stage `rank` of `stages`; an interleaved rank's chunks log into one order (their chunk index).
  FakeStage(int rank, int stages, std::vector<PipelineUnit>* log = nullptr, int chunk = 0)
      : order_log(log ? log : &order), r_(rank), P_(stages), chunk_(chunk), out_(kElements), grad_out_(kElements),
        grad_in_(kElements) {}
  std::size_t boundary_elements() const override { return kElements; }
  void* input(int slot) override { return slot_data(slot).data(); }
  const void* output() const override { return out_.data(); }
  float* output_grad() override { return grad_out_.data(); }
  const float* input_grad() const override { return grad_in_.data(); }
  void* stream() override { return nullptr; }

  void forward(int mb, int slot, bool training) override {
    order_log->push_back({true, chunk_, mb});
    auto& x = slot_data(slot);
    if (r_ == 0) x = activations(mb, 0);
    if (x != activations(mb, r_)) ++wrong_inputs;
    for (std::size_t i = 0; i < kElements; ++i) out_[i] = static_cast<std::uint16_t>(3 * x[i] + r_ + 1);
    if (r_ == P_ - 1) loss += static_cast<double>(mb + 1) * (training ? 1 : 10);
  }
  void backward(int mb, int slot) override {
    order_log->push_back({false, chunk_, mb});
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
  std::vector<PipelineUnit>* order_log;
  int wrong_inputs = 0, wrong_slots = 0, wrong_gradients = 0;
  double loss = 0;

 private:
  std::vector<std::uint16_t>& slot_data(int slot) {
    while (static_cast<int>(slots_.size()) <= slot) slots_.emplace_back(kElements);
    return slots_[static_cast<std::size_t>(slot)];
  }
  int r_, P_, chunk_;
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

// Interleaved: V chunks per rank, chunk v of rank r is global stage v * P + r of P * V, the ring's
// transfers checked the same way (values, slots, gradients, order of work, loss on the last stage).
void run_interleaved(int pipeline_size, int chunks, int micro_batches, bool training) {
  ASSERT_EQ(mpi_world().size(), 4);
  ProcessGroups groups = make_process_groups(mpi_world(), derive_parallel_config(4, 1, pipeline_size));
  auto group = host_device_group(*groups.pipeline);
  const int r = groups.pipeline->rank(), P = groups.pipeline->size();
  std::vector<PipelineUnit> order;
  std::vector<std::unique_ptr<FakeStage>> stages;
  std::vector<PipelineStage*> views;
  for (int v = 0; v < chunks; ++v) {
    stages.push_back(std::make_unique<FakeStage>(v * P + r, P * chunks, &order, v));
    views.push_back(stages.back().get());
  }
  const int held = run_pipeline_interleaved(views, group.get(), micro_batches, training);
  const std::string what =
      fmt::format("PP{} V={} M={} {} rank {}", P, chunks, micro_batches, training ? "interleaved 1F1B" : "forward", r);
  double loss = 0;
  for (const auto& s : stages) {
    EXPECT_EQ(s->wrong_inputs, 0) << what;
    EXPECT_EQ(s->wrong_slots, 0) << what;
    EXPECT_EQ(s->wrong_gradients, 0) << what;
    loss += s->loss;
  }
  std::vector<PipelineUnit> want;
  for (const PipelineUnit& u : pipeline_order(P, r, chunks, micro_batches))
    if (training || u.forward) want.push_back(u);
  if (!training) {  // forward only: unit k's order, micro-batches P at a time through each chunk
    want.clear();
    for (int k = 0; k < micro_batches * chunks; ++k)
      want.push_back({true, (k % (P * chunks)) / P, (k / (P * chunks)) * P + k % P});
  }
  ASSERT_EQ(order.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(order[i].forward, want[i].forward) << what << " unit " << i;
    EXPECT_EQ(order[i].chunk, want[i].chunk) << what << " unit " << i;
    EXPECT_EQ(order[i].micro_batch, want[i].micro_batch) << what << " unit " << i;
  }
  EXPECT_GE(held, 1) << what;
  const double expected = r == P - 1 ? micro_batches * (micro_batches + 1) / 2.0 * (training ? 1 : 10) : 0.0;
  EXPECT_EQ(loss, expected) << what;
}

TEST(DevicePipeline, InterleavedFourStagesRing) {
  for (int v : {2, 3})
    for (int m : {4, 8, 12}) run_interleaved(4, v, m, true);
}
TEST(DevicePipeline, InterleavedTwoStagesShareOnePairBothWays) {
  for (int v : {2, 3})
    for (int m : {2, 4, 6}) run_interleaved(2, v, m, true);
}
TEST(DevicePipeline, InterleavedForwardOnly) {
  run_interleaved(4, 2, 8, false);
  run_interleaved(2, 3, 4, false);
}
TEST(DevicePipeline, InterleavedNeedsWholeRoundsOfMicroBatches) {
  ProcessGroups groups = make_process_groups(mpi_world(), derive_parallel_config(4, 1, 2));
  auto group = host_device_group(*groups.pipeline);
  FakeStage a(groups.pipeline->rank(), 4), b(groups.pipeline->rank() + 2, 4);
  std::vector<PipelineStage*> views{&a, &b};
  EXPECT_THROW(run_pipeline_interleaved(views, group.get(), 3, true), dlm::Error);
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
