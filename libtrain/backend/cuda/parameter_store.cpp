#include "parameter_store.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <future>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/common/thread_pool.h"
#include "master_split.h"

namespace dlm::train::cuda {
namespace {

// Every tensor of `store` as export_master / export_part give it, in model order: zeros outside its part in the
// optimizer range, the part appended by append(out, part). Each tensor's memory is written once (no zeroing pass
// first), on a pool's threads, one task a tensor (a large tensor does not hold up a thread's share of the others).
using AppendPart = std::function<void(std::vector<float>&, const ParameterStore::MomentPart&)>;
std::vector<std::vector<float>> fill_tensors(const ParameterStore& store, const AppendPart& append) {
  std::vector<std::vector<float>> out(store.specs.size());
  ThreadPool pool(std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 16));
  std::vector<std::future<void>> done;
  for (std::size_t i = 0; i < out.size(); ++i)
    done.push_back(pool.submit([&, i] {
      const int p = static_cast<int>(i);
      const ParameterStore::MomentPart part = store.moment_part(p);
      std::vector<float>& values = out[i];
      values.reserve(static_cast<std::size_t>(store.numel(p)));
      values.resize(static_cast<std::size_t>(part.in_tensor));
      append(values, part);
      values.resize(static_cast<std::size_t>(store.numel(p)));
    }));
  for (auto& d : done) d.get();
  return out;
}

}  // namespace

void ParameterStore::allocate(std::vector<ckpt::TensorShard> tensors, int optimizer_shards, int rank, cudaStream_t st) {
  specs = std::move(tensors);
  shards = optimizer_shards;
  stream = st;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    index[specs[i].name] = static_cast<int>(i);
    offset.push_back(total);
    total += aligned_numel(static_cast<int>(i));
  }
  // Equal, aligned optimizer ranges (a reduce-scatter's blocks): the buffer grows to a multiple of them.
  const std::int64_t quantum = kAlign * shards;
  total = (total + quantum - 1) / quantum * quantum;
  opt_numel = total / shards;
  opt_first = opt_numel * rank;
  // The optimizer state (the master weights' lower halves, moments) of the rank's range only; the bf16 weights
  // (the upper halves) and the gradients whole (the forward and backward need every weight; the gradients are
  // reduce-scattered in place).
  w16 = arena.alloc<bf16>(total + opt_numel);
  w_lo = reinterpret_cast<std::int16_t*>(w16 + total);
  grad = arena.alloc<float>(total);
  m = arena.alloc<float>(opt_numel);
  v = arena.alloc<float>(opt_numel);
  norm_offset.assign(specs.size(), -1);
  for (std::size_t i = 0; i < specs.size(); ++i)
    if (specs[i].is_norm) norm_offset[i] = norm_total, norm_total += aligned_numel(static_cast<int>(i));
  norms32 = arena.alloc<float>(norm_total);
  norms_owned = sharded() ? arena.alloc<float>(norm_total) : norms32;
  for (float* norms : {norms32, norms_owned})
    check_cuda(cudaMemsetAsync(norms, 0, sizeof(float) * norm_total, stream), "memset");
  check_cuda(cudaMemsetAsync(w16, 0, sizeof(bf16) * (total + opt_numel), stream), "memset");
  check_cuda(cudaMemsetAsync(m, 0, sizeof(float) * opt_numel, stream), "memset");
  check_cuda(cudaMemsetAsync(v, 0, sizeof(float) * opt_numel, stream), "memset");
  check_cuda(cudaMemsetAsync(grad, 0, sizeof(float) * total, stream), "memset");
  adam_dev = arena.alloc<AdamWTensor>(static_cast<std::int64_t>(specs.size()));
  const std::vector<AdamWTensor> list = adam_list(0.0);
  const std::vector<AdamWChunk> chunks = adamw_chunks(list.data(), static_cast<int>(list.size()));
  num_chunks = static_cast<int>(chunks.size());
  adam_chunks = arena.alloc<AdamWChunk>(num_chunks);
  check_cuda(cudaMemcpyAsync(adam_chunks, chunks.data(), chunks.size() * sizeof(AdamWChunk), cudaMemcpyHostToDevice,
                             stream),
             "adamw chunks");
  // The gradient norm counts the tensors this rank saves (a replicated norm once, on tensor rank 0), in its
  // optimizer range (the ranges' sums add up over the data-parallel group).
  std::vector<int> listed;  // the spec of each entry of the list (adam_list leaves out those the range misses)
  for (int p = 0; p < static_cast<int>(specs.size()); ++p)
    if (moment_part(p).numel > 0) listed.push_back(p);
  std::vector<AdamWChunk> counted;
  for (const AdamWChunk& chunk : chunks)
    if (specs[static_cast<std::size_t>(listed[static_cast<std::size_t>(chunk.tensor)])].saved) counted.push_back(chunk);
  num_norm_chunks = static_cast<int>(counted.size());
  norm_chunks = arena.alloc<AdamWChunk>(num_norm_chunks);
  if (!counted.empty())
    check_cuda(cudaMemcpyAsync(norm_chunks, counted.data(), counted.size() * sizeof(AdamWChunk), cudaMemcpyHostToDevice,
                               stream),
               "norm chunks");
  norm_partial = arena.alloc<double>(num_chunks);
  sumsq = arena.alloc<double>(1);
  zeros = arena.alloc<unsigned long long>(1);
}

int ParameterStore::find_or_fail(std::string_view name) const {
  const int p = find(std::string(name));
  if (p < 0) fail(fmt::format("CudaModel: no parameter '{}'", name));
  return p;
}

ParameterStore::MomentPart ParameterStore::moment_part(int p) const {
  const std::int64_t lo = opt_first, hi = opt_first + opt_numel;
  const std::int64_t a = std::max(offset[p], lo), b = std::min(offset[p] + numel(p), hi);
  if (a >= b) return {};
  return {a - offset[p], a - lo, b - a};
}

std::vector<AdamWTensor> ParameterStore::adam_list(double weight_decay) const {
  std::vector<AdamWTensor> list;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const int p = static_cast<int>(i);
    const MomentPart part = moment_part(p);
    if (part.numel == 0) continue;
    float* f32 = norm_offset[i] >= 0 ? norms_owned + norm_offset[i] + part.in_tensor : nullptr;
    list.push_back({w16 + offset[i] + part.in_tensor, w_lo + part.in_moments, f32, G(p) + part.in_tensor,
                    m + part.in_moments, v + part.in_moments, part.numel,
                    specs[i].is_norm ? 0.0f : static_cast<float>(weight_decay)});
  }
  return list;
}

void ParameterStore::set_weights(int p, const float* values) {
  const MomentPart part = moment_part(p);
  if (part.numel < numel(p)) split_master(values, w16 + offset[p], nullptr, numel(p), stream);
  if (part.numel > 0)
    split_master(values + part.in_tensor, w16 + offset[p] + part.in_tensor, w_lo + part.in_moments, part.numel,
                 stream);
  check_cuda(cudaGetLastError(), "split_master");
  if (norm_offset[p] < 0) return;
  check_cuda(cudaMemcpyAsync(norms32 + norm_offset[p], values, sizeof(float) * numel(p), cudaMemcpyDeviceToDevice,
                             stream),
             "norm weights");
  if (norms_owned != norms32 && part.numel > 0)
    check_cuda(cudaMemcpyAsync(norms_owned + norm_offset[p] + part.in_tensor, values + part.in_tensor,
                               sizeof(float) * part.numel, cudaMemcpyDeviceToDevice, stream),
               "norm weights");
}

std::vector<float> ParameterStore::export_master(int p) const {
  std::vector<float> out(static_cast<std::size_t>(numel(p)), 0.0f);
  const MomentPart part = moment_part(p);
  if (part.numel > 0) {
    const auto n = static_cast<std::size_t>(part.numel);
    std::vector<std::uint16_t> hi(n);
    std::vector<std::int16_t> lo(n);
    check_cuda(cudaMemcpyAsync(hi.data(), w16 + offset[p] + part.in_tensor, n * 2, cudaMemcpyDeviceToHost, stream),
               "export");
    check_cuda(cudaMemcpyAsync(lo.data(), w_lo + part.in_moments, n * 2, cudaMemcpyDeviceToHost, stream), "export");
    check_cuda(cudaStreamSynchronize(stream), "export");
    for (std::size_t i = 0; i < n; ++i)
      out[static_cast<std::size_t>(part.in_tensor) + i] = std::bit_cast<float>(join_master_bits(hi[i], lo[i]));
  }
  return out;
}

std::vector<float> ParameterStore::export_part(int p, const float* range_buffer) const {
  std::vector<float> out(static_cast<std::size_t>(numel(p)), 0.0f);
  const MomentPart part = moment_part(p);
  if (part.numel > 0)
    check_cuda(cudaMemcpyAsync(out.data() + part.in_tensor, range_buffer + part.in_moments,
                               static_cast<std::size_t>(part.numel) * 4, cudaMemcpyDeviceToHost, stream),
               "export");
  check_cuda(cudaStreamSynchronize(stream), "export");
  return out;
}

std::byte* ParameterStore::pinned(Pinned& buffer, std::size_t bytes_per_element) const {
  if (!buffer) {
    void* host = nullptr;
    const std::size_t bytes = static_cast<std::size_t>(std::max<std::int64_t>(opt_numel, 1)) * bytes_per_element;
    check_cuda(cudaHostAlloc(&host, bytes, cudaHostAllocDefault),
               fmt::format("pinned host buffer of {} bytes for checkpoints", bytes).c_str());
    buffer.reset(static_cast<std::byte*>(host));
  }
  return buffer.get();
}

// pinned_master: the range's upper halves (2 bytes an element), then its lower halves (2).
std::vector<std::vector<float>> ParameterStore::export_masters() {
  const auto n = static_cast<std::size_t>(opt_numel);
  std::byte* host = pinned(pinned_master, 4);
  const auto* hi = reinterpret_cast<const std::uint16_t*>(host);
  const auto* lo = reinterpret_cast<const std::int16_t*>(host + 2 * n);
  check_cuda(cudaMemcpyAsync(host, w16 + opt_first, n * 2, cudaMemcpyDeviceToHost, stream), "export");
  check_cuda(cudaMemcpyAsync(host + 2 * n, w_lo, n * 2, cudaMemcpyDeviceToHost, stream), "export");
  check_cuda(cudaStreamSynchronize(stream), "export");
  return fill_tensors(*this, [hi, lo](std::vector<float>& out, const MomentPart& part) {
    for (std::int64_t i = part.in_moments, end = part.in_moments + part.numel; i < end; ++i)
      out.push_back(std::bit_cast<float>(join_master_bits(hi[i], lo[i])));
  });
}

void ParameterStore::export_moments(std::vector<std::vector<float>>& exp_avg,
                                    std::vector<std::vector<float>>& exp_avg_sq) {
  const auto n = static_cast<std::size_t>(opt_numel);
  std::byte* host = pinned(pinned_moments, 8);  // m, then v
  const auto* hm = reinterpret_cast<const float*>(host);
  const auto* hv = reinterpret_cast<const float*>(host + 4 * n);
  check_cuda(cudaMemcpyAsync(host, m, n * 4, cudaMemcpyDeviceToHost, stream), "export");
  check_cuda(cudaMemcpyAsync(host + 4 * n, v, n * 4, cudaMemcpyDeviceToHost, stream), "export");
  check_cuda(cudaStreamSynchronize(stream), "export");
  const auto from = [](const float* range) {
    return [range](std::vector<float>& out, const MomentPart& part) {
      out.insert(out.end(), range + part.in_moments, range + part.in_moments + part.numel);
    };
  };
  exp_avg = fill_tensors(*this, from(hm));
  exp_avg_sq = fill_tensors(*this, from(hv));
}

}  // namespace dlm::train::cuda
