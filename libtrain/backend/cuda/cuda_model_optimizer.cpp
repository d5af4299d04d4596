// CudaModel's optimizer side: the global gradient norm and AdamW on the device (adamw.cu), the moments'
// import/export for checkpoints, the device views that data parallelism all-reduces, and the distributed
// optimizer's sharing of the updated weights.
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "cuda_model_impl.h"
#include "dlm/common/error.h"

namespace dlm::train {
namespace {

// Every optimizer pass starts here: gradients still fresh after zero_grad are cleared, the tensor list (with
// the decay AdamW applies; the norm ignores it) uploaded, the profiler's phase clock started.
void begin_pass(CudaModel::Impl& I, double weight_decay) {
  I.settle_grads();
  I.upload_adam_list(weight_decay);
  I.timer.start(I.stream);
}
// The sum of squares of the gradients this rank counts, into I.sumsq on the device.
void enqueue_norm(CudaModel::Impl& I) {
  cuda::grad_sumsq(I.adam_dev, I.norm_chunks, I.num_norm_chunks, I.norm_partial, I.sumsq, I.stream);
  I.timer.mark("grad norm", I.stream);
}
// The update of the tensors in I's list by the sum of squares already on the device (I.sumsq).
void enqueue_adamw(CudaModel::Impl& I, const AdamWOptions& o, double lr, double max_norm) {
  I.record_adamw_step(cuda::adamw_step_scalars(static_cast<float>(lr), static_cast<float>(o.beta1),
                                               static_cast<float>(o.beta2), static_cast<float>(o.eps), I.steps + 1,
                                               static_cast<float>(o.weight_decay)));
  cuda::adamw_step(I.adam_dev, I.adam_chunks, I.num_chunks, I.sumsq, max_norm, static_cast<float>(lr),
                   static_cast<float>(o.beta1), static_cast<float>(o.beta2), static_cast<float>(o.eps), ++I.steps,
                   I.stream);
  I.timer.mark("adamw", I.stream);
}
// Ends the pass (phases, launch errors) and, when `read`, waits for the sum of squares and returns it.
double end_pass(CudaModel::Impl& I, const char* what, bool read) {
  I.timer.finish(false);
  check_cuda(cudaGetLastError(), what);
  if (!read) return 0;
  double sumsq = 0;
  check_cuda(cudaMemcpyAsync(&sumsq, I.sumsq, sizeof(double), cudaMemcpyDeviceToHost, I.stream), "norm");
  check_cuda(cudaStreamSynchronize(I.stream), "norm");
  return sumsq;
}

}  // namespace

double CudaModel::grad_sumsq() {
  auto& I = *impl_;
  begin_pass(I, 0.0);
  enqueue_norm(I);
  return end_pass(I, "grad norm", true);
}

void CudaModel::set_grad_sumsq(double sumsq) {
  check_cuda(cudaMemcpyAsync(impl_->sumsq, &sumsq, sizeof(double), cudaMemcpyHostToDevice, impl_->stream), "norm");
  synchronize();
}

double CudaModel::grad_norm() { return std::sqrt(grad_sumsq()); }

void CudaModel::apply_adamw(const AdamWOptions& o, double lr, double max_norm) {
  auto& I = *impl_;
  begin_pass(I, o.weight_decay);
  enqueue_adamw(I, o, lr, max_norm);
  end_pass(I, "adamw", false);
}

// The norm and the update enqueued back to back (AdamW reads the sum of squares on the device); the host waits
// once, for the norm, while the update runs, not between the two.
double CudaModel::adamw_step(const AdamWOptions& o, double lr, double max_norm) {
  auto& I = *impl_;
  begin_pass(I, o.weight_decay);
  enqueue_norm(I);
  enqueue_adamw(I, o, lr, max_norm);
  return std::sqrt(end_pass(I, "adamw", true));
}

std::vector<float> CudaModel::export_exp_avg(std::string_view name) const {
  impl_->settle_embedding();
  return impl_->export_part(impl_->find_or_fail(name), impl_->m);
}

std::vector<float> CudaModel::export_exp_avg_sq(std::string_view name) const {
  impl_->settle_embedding();
  return impl_->export_part(impl_->find_or_fail(name), impl_->v);
}

void CudaModel::import_moments(std::string_view name, std::span<const float> exp_avg,
                               std::span<const float> exp_avg_sq) {
  auto& I = *impl_;
  const int p = I.find_or_fail(name);
  I.settle_embedding();
  if (static_cast<std::int64_t>(exp_avg.size()) != I.numel(p) || exp_avg_sq.size() != exp_avg.size())
    fail(fmt::format("CudaModel: moments of '{}' have {} / {} elements, the tensor {}", name, exp_avg.size(),
                     exp_avg_sq.size(), I.numel(p)));
  const auto part = I.moment_part(p);
  if (part.numel == 0) return;
  const auto bytes = static_cast<std::size_t>(part.numel) * 4;
  check_cuda(cudaMemcpyAsync(I.m + part.in_moments, exp_avg.data() + part.in_tensor, bytes, cudaMemcpyHostToDevice,
                             I.stream),
             "import exp_avg");
  check_cuda(cudaMemcpyAsync(I.v + part.in_moments, exp_avg_sq.data() + part.in_tensor, bytes,
                             cudaMemcpyHostToDevice, I.stream),
             "import exp_avg_sq");
  synchronize();
}

std::int64_t CudaModel::optimizer_steps() const { return impl_->steps; }
void CudaModel::set_optimizer_steps(std::int64_t steps) {
  auto& I = *impl_;
  I.settle_embedding();
  I.steps = static_cast<int>(steps);
  if (I.sparse_emb) I.embedding_rows_current();
}

CudaModel::Span CudaModel::gradient_buffer() const { return {"", impl_->grad, impl_->total}; }
CudaModel::Span CudaModel::parameter_buffer() const {
  if (impl_->sharded())
    fail("CudaModel: parameter_buffer() is the whole master weights, which no optimizer shard holds");
  impl_->settle_embedding();
  return {"", reinterpret_cast<float*>(impl_->w16), impl_->total};  // w16 then w_lo: 4 bytes a parameter
}
CudaModel::Range CudaModel::optimizer_range() const { return {impl_->opt_first, impl_->opt_numel}; }

std::vector<CudaModel::Span> CudaModel::gradient_buffers() const {
  std::vector<Span> out;
  for (std::size_t i = 0; i < impl_->specs.size(); ++i)
    out.push_back({impl_->specs[i].name, impl_->G(static_cast<int>(i)), impl_->numel(static_cast<int>(i))});
  return out;
}

void* CudaModel::stream() const { return impl_->stream; }
void CudaModel::set_backward_layer_hook(std::function<void(int)> hook) { impl_->layer_hook = std::move(hook); }

void CudaModel::master_weights_written() {
  auto& I = *impl_;
  if (I.sharded()) fail("CudaModel: master_weights_written() needs whole master weights (with optimizer shards, "
                        "share_updated_weights() publishes them)");
  for (std::size_t i = 0; i < I.specs.size(); ++i)
    if (I.norm_offset[i] >= 0)
      cuda::join_master(I.w16 + I.offset[i], I.w_lo + I.offset[i], I.norms32 + I.norm_offset[i],
                        I.numel(static_cast<int>(i)), I.stream);
  check_cuda(cudaGetLastError(), "join_master");
  synchronize();
}

void CudaModel::share_updated_weights(DeviceGroup& data) {
  auto& I = *impl_;
  if (!I.sharded()) return;
  if (data.size() != I.shard.optimizer_shards || data.rank() != I.shard.optimizer_rank)
    fail(fmt::format("CudaModel: optimizer shard {} of {}, but the data-parallel group has rank {} of {}",
                     I.shard.optimizer_rank, I.shard.optimizer_shards, data.rank(), data.size()));
  // AdamW wrote the upper halves (the bf16 weights) of exactly the range it updated: gather the ranges in place.
  data.all_gather(I.w16 + I.opt_first, I.w16, static_cast<std::size_t>(I.opt_numel), DeviceElement::kBF16, I.stream);
  // The norms' fp32 copies: each rank's norms_owned holds the elements it owns over zeros, and the group's sum
  // gives every rank the owners' values exactly (x + 0 = x).
  if (I.norm_total == 0) return;
  check_cuda(cudaMemcpyAsync(I.norms32, I.norms_owned, sizeof(float) * I.norm_total, cudaMemcpyDeviceToDevice,
                             I.stream),
             "norm weights");
  data.all_reduce(I.norms32, static_cast<std::size_t>(I.norm_total), DeviceElement::kF32, I.stream);
}

}  // namespace dlm::train
