// CudaModel's optimizer side: the global gradient norm and AdamW on the device (adamw.cu), the moments'
// import/export for checkpoints, the device views that data parallelism all-reduces, and the distributed
// optimizer's sharing of the updated weights.
#include <cmath>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cuda_model_impl.h"
#include "dlm/common/error.h"

namespace dlm::train {

void CudaModel::Impl::upload_adam_list(double weight_decay) {
  std::vector<AdamWTensor> list = params.adam_list(weight_decay);
  if (deferred.on)  // no optimizer shards: the embedding's entry is all of it
    for (AdamWTensor& t : list)
      if (t.grad == params.G(emb)) t.rows_written = deferred.written, t.row_len = d(), t.row_step = deferred.row_step;
  check_cuda(cudaMemcpyAsync(params.adam_dev, list.data(), list.size() * sizeof(AdamWTensor), cudaMemcpyHostToDevice,
                             stream),
             "adamw list");
}

namespace {

// Every optimizer pass starts here: gradients still fresh after zero_grad are cleared, the tensor list (with
// the decay AdamW applies; the norm ignores it) uploaded, the profiler's phase clock started.
void begin_pass(CudaModel::Impl& I, double weight_decay) {
  I.before_state_write();
  I.settle_grads();
  I.upload_adam_list(weight_decay);
  I.timer.start(I.stream);
}
// The sum of squares of the gradients this rank counts, into I.params.sumsq on the device.
void enqueue_norm(CudaModel::Impl& I) {
  cuda::grad_sumsq(I.params.adam_dev, I.params.norm_chunks, I.params.num_norm_chunks, I.params.norm_partial,
                   I.params.sumsq, I.stream);
  I.timer.mark("grad norm", I.stream);
}
// The update of the tensors in I's list by the sum of squares already on the device (I.params.sumsq).
void enqueue_adamw(CudaModel::Impl& I, const AdamWOptions& o, double lr, double max_norm) {
  I.record_adamw_step(cuda::adamw_step_scalars(static_cast<float>(lr), static_cast<float>(o.beta1),
                                               static_cast<float>(o.beta2), static_cast<float>(o.eps),
                                               I.params.steps + 1, static_cast<float>(o.weight_decay)));
  cuda::adamw_step(I.params.adam_dev, I.params.adam_chunks, I.params.num_chunks, I.params.sumsq, max_norm,
                   static_cast<float>(lr), static_cast<float>(o.beta1), static_cast<float>(o.beta2),
                   static_cast<float>(o.eps), ++I.params.steps, I.stream);
  I.timer.mark("adamw", I.stream);
  I.weights_changed();
}
// Ends the pass (phases, launch errors) and, when `read`, waits for the sum of squares and returns it.
double end_pass(CudaModel::Impl& I, const char* what, bool read) {
  I.timer.finish(false);
  check_cuda(cudaGetLastError(), what);
  if (!read) return 0;
  double sumsq = 0;
  check_cuda(cudaMemcpyAsync(&sumsq, I.params.sumsq, sizeof(double), cudaMemcpyDeviceToHost, I.stream), "norm");
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
  check_cuda(cudaMemcpyAsync(impl_->params.sumsq, &sumsq, sizeof(double), cudaMemcpyHostToDevice, impl_->stream),
             "norm");
  synchronize();
}

double CudaModel::grad_norm() { return std::sqrt(grad_sumsq()); }

std::int64_t CudaModel::grad_zeros() {
  auto& I = *impl_;
  begin_pass(I, 0.0);
  cuda::count_grad_zeros(I.params.adam_dev, I.params.norm_chunks, I.params.num_norm_chunks, I.params.zeros, I.stream);
  I.timer.mark("grad zeros", I.stream);
  end_pass(I, "grad zeros", false);
  unsigned long long zeros = 0;
  check_cuda(cudaMemcpyAsync(&zeros, I.params.zeros, sizeof zeros, cudaMemcpyDeviceToHost, I.stream), "zeros");
  check_cuda(cudaStreamSynchronize(I.stream), "zeros");
  return static_cast<std::int64_t>(zeros);
}

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
  return impl_->params.export_part(impl_->params.find_or_fail(name), impl_->params.m);
}

std::vector<float> CudaModel::export_exp_avg_sq(std::string_view name) const {
  impl_->settle_embedding();
  return impl_->params.export_part(impl_->params.find_or_fail(name), impl_->params.v);
}

void CudaModel::export_moments(std::vector<std::vector<float>>& exp_avg,
                               std::vector<std::vector<float>>& exp_avg_sq) {
  impl_->settle_embedding();
  impl_->params.export_moments(exp_avg, exp_avg_sq);
}

void CudaModel::import_moments(std::string_view name, std::span<const float> exp_avg,
                               std::span<const float> exp_avg_sq) {
  auto& I = *impl_;
  const int p = I.params.find_or_fail(name);
  I.settle_embedding();
  if (static_cast<std::int64_t>(exp_avg.size()) != I.params.numel(p) || exp_avg_sq.size() != exp_avg.size())
    fail(fmt::format("CudaModel: moments of '{}' have {} / {} elements, the tensor {}", name, exp_avg.size(),
                     exp_avg_sq.size(), I.params.numel(p)));
  const auto part = I.params.moment_part(p);
  if (part.numel == 0) return;
  I.before_state_write();
  const auto bytes = static_cast<std::size_t>(part.numel) * 4;
  check_cuda(cudaMemcpyAsync(I.params.m + part.in_moments, exp_avg.data() + part.in_tensor, bytes,
                             cudaMemcpyHostToDevice, I.stream),
             "import exp_avg");
  check_cuda(cudaMemcpyAsync(I.params.v + part.in_moments, exp_avg_sq.data() + part.in_tensor, bytes,
                             cudaMemcpyHostToDevice, I.stream),
             "import exp_avg_sq");
  synchronize();
}

std::int64_t CudaModel::optimizer_steps() const { return impl_->params.steps; }
void CudaModel::set_optimizer_steps(std::int64_t steps) {
  auto& I = *impl_;
  I.settle_embedding();
  I.params.steps = static_cast<int>(steps);
  if (I.deferred.on) I.embedding_rows_current();
}

CudaModel::Span CudaModel::gradient_buffer() const { return {"", impl_->params.grad, impl_->params.total}; }
CudaModel::Span CudaModel::parameter_buffer() const {
  if (impl_->params.sharded())
    fail("CudaModel: parameter_buffer() is the whole master weights, which no optimizer shard holds");
  impl_->settle_embedding();
  return {"", reinterpret_cast<float*>(impl_->params.w16), impl_->params.total};  // w16 then w_lo: 4 bytes a parameter
}
CudaModel::Range CudaModel::optimizer_range() const { return {impl_->params.opt_first, impl_->params.opt_numel}; }

std::vector<CudaModel::Span> CudaModel::gradient_buffers() const {
  std::vector<Span> out;
  for (std::size_t i = 0; i < impl_->params.specs.size(); ++i)
    out.push_back(
        {impl_->params.specs[i].name, impl_->params.G(static_cast<int>(i)), impl_->params.numel(static_cast<int>(i))});
  return out;
}

void* CudaModel::stream() const { return impl_->stream; }
void CudaModel::set_backward_layer_hook(std::function<void(int)> hook) { impl_->layer_hook = std::move(hook); }

void CudaModel::master_weights_written() {
  auto& I = *impl_;
  if (I.params.sharded()) fail("CudaModel: master_weights_written() needs whole master weights (with optimizer shards, "
                        "share_updated_weights() publishes them)");
  I.before_state_write();
  for (std::size_t i = 0; i < I.params.specs.size(); ++i)
    if (I.params.norm_offset[i] >= 0)
      cuda::join_master(I.params.w16 + I.params.offset[i], I.params.w_lo + I.params.offset[i],
                        I.params.norms32 + I.params.norm_offset[i], I.params.numel(static_cast<int>(i)), I.stream);
  check_cuda(cudaGetLastError(), "join_master");
  I.weights_changed();
  synchronize();
}

void CudaModel::share_updated_weights(DeviceGroup& data) {
  auto& I = *impl_;
  if (!I.params.sharded()) return;
  I.before_state_write();
  if (data.size() != I.shard.optimizer_shards || data.rank() != I.shard.optimizer_rank)
    fail(fmt::format("CudaModel: optimizer shard {} of {}, but the data-parallel group has rank {} of {}",
                     I.shard.optimizer_rank, I.shard.optimizer_shards, data.rank(), data.size()));
  // AdamW wrote the upper halves (the bf16 weights) of exactly the range it updated: gather the ranges in place.
  data.all_gather(I.params.w16 + I.params.opt_first, I.params.w16, static_cast<std::size_t>(I.params.opt_numel),
                  DeviceElement::kBF16, I.stream);
  I.weights_changed();
  // The norms' fp32 copies: each rank's norms_owned holds the elements it owns over zeros, and the group's sum
  // gives every rank the owners' values exactly (x + 0 = x).
  if (I.params.norm_total == 0) return;
  check_cuda(cudaMemcpyAsync(I.params.norms32, I.params.norms_owned, sizeof(float) * I.params.norm_total,
                             cudaMemcpyDeviceToDevice, I.stream),
             "norm weights");
  data.all_reduce(I.params.norms32, static_cast<std::size_t>(I.params.norm_total), DeviceElement::kF32, I.stream);
}

}  // namespace dlm::train
