// Expert parallelism of one MoE layer (model.h's EP line; docs/moe.md): megatron-core's alltoall token dispatcher
// on the host. With EP ranks each holding E_l = E / EP experts, rank p's routed slots (n, j) go to rank e_j / E_l:
//   forward:  counts all-to-all; rows x[n] (and their local expert e_j % E_l) all-to-all-v; this rank's experts
//             run the rows it received (weight 1); their outputs y come back by the reverse all-to-all-v;
//             out[n] = sum_j w[n, j] y[n, j] where the token lives.
//   backward: dw[n, j] = dout[n] . y[n, j]; the rows w[n, j] dout[n] go out as in the forward, this rank's experts
//             take their backward (their weight gradients accumulate every EP rank's tokens), and the row
//             gradients come back: dx[n] = sum_j dx[n, j].
// Every member runs the same layers in the same order, so the collectives match without tags.
#include <algorithm>
#include <numeric>

#include "model_internal.h"

namespace dlm::train {
namespace {

// Rows of `width` floats from `from`, in `order`, into consecutive rows of `to`.
void gather_rows_of(std::span<const float> from, std::span<const std::int64_t> rows, std::int64_t width,
                    std::span<float> to) {
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::copy_n(from.begin() + rows[i] * width, width, to.begin() + static_cast<std::int64_t>(i) * width);
}

std::vector<std::int64_t> scaled(const std::vector<std::int64_t>& rows, std::int64_t width) {
  std::vector<std::int64_t> out(rows);
  for (auto& r : out) r *= width;
  return out;
}

}  // namespace

void Model::expert_parallel_forward(std::size_t l, const Tensor& input, const Tensor& out) {
  const Layer& P = layers_[l];
  auto& A = acts_->layers[l];
  ExpertExchange& X = A.exchange;
  Communicator& ep = *shard_.expert;
  Backend& be = backend_;
  const std::int64_t H = config_.hidden_size, k = config_.moe_router_topk, N = A.routing.tokens;
  const std::int64_t local_experts = config_.num_experts / ep.size();
  const auto ranks = static_cast<std::size_t>(ep.size());
  const std::vector<std::int32_t>& experts = A.routing.experts;

  // The slots grouped by destination rank, each group in slot order.
  X.order.resize(static_cast<std::size_t>(N * k));
  std::iota(X.order.begin(), X.order.end(), 0);
  std::stable_sort(X.order.begin(), X.order.end(), [&](std::int64_t a, std::int64_t b) {
    return experts[a] / local_experts < experts[b] / local_experts;
  });
  X.send_rows.assign(ranks, 0);
  for (std::int32_t e : experts) ++X.send_rows[static_cast<std::size_t>(e / local_experts)];
  X.recv_rows.assign(ranks, 0);
  ep.all_to_all<std::int64_t>(X.send_rows, X.recv_rows);
  X.received = std::accumulate(X.recv_rows.begin(), X.recv_rows.end(), std::int64_t{0});

  std::vector<float> x(static_cast<std::size_t>(N * H));
  be.copy_to_host(input, x);
  std::vector<std::int64_t> tokens(X.order.size());
  std::vector<std::int32_t> local(X.order.size());
  for (std::size_t i = 0; i < X.order.size(); ++i) {
    tokens[i] = X.order[i] / k;
    local[i] = static_cast<std::int32_t>(experts[static_cast<std::size_t>(X.order[i])] % local_experts);
  }
  std::vector<float> send(X.order.size() * static_cast<std::size_t>(H));
  gather_rows_of(x, tokens, H, send);
  std::vector<float> recv(static_cast<std::size_t>(X.received * H));
  std::vector<std::int32_t> recv_local(static_cast<std::size_t>(X.received));
  const auto send_counts = scaled(X.send_rows, H), recv_counts = scaled(X.recv_rows, H);
  ep.all_to_all_v<float>(send, send_counts, recv, recv_counts);
  ep.all_to_all_v<std::int32_t>(local, X.send_rows, recv_local, X.recv_rows);

  std::vector<float> y(recv.size());
  if (X.received > 0) {
    const std::int64_t M = X.received, F = params_[P.experts_fc2].value.dim(2);  // this tensor rank's share
    X.x = be.alloc({M, H});
    X.idx = be.alloc({M, 1}, DType::kI32);
    X.ones = be.alloc({M, 1});
    X.out = be.alloc({M, H});
    X.gate_up = be.alloc({M, 2 * F});
    X.act = be.alloc({M, F});
    be.copy_from_host(X.x, std::span<const float>(recv));
    be.copy_from_host(X.idx, std::span<const std::int32_t>(recv_local));
    be.copy_from_host(X.ones, std::span<const float>(std::vector<float>(static_cast<std::size_t>(M), 1.0f)));
    be.moe_experts_forward(X.x, X.idx, X.ones, params_[P.experts_fc1].value, params_[P.experts_fc2].value, X.out,
                           X.gate_up, X.act);
    be.copy_to_host(X.out, y);
  }
  X.outputs.resize(send.size());
  ep.all_to_all_v<float>(y, recv_counts, X.outputs, send_counts);

  // out[n] = sum_j w[n, j] y[n, j], j in order.
  std::vector<std::int64_t> position(X.order.size());
  for (std::size_t i = 0; i < X.order.size(); ++i) position[static_cast<std::size_t>(X.order[i])] = static_cast<std::int64_t>(i);
  std::vector<float> combined(static_cast<std::size_t>(N * H), 0.0f);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t j = 0; j < k; ++j) {
      const float w = A.routing.weights[static_cast<std::size_t>(n * k + j)];
      const float* row = X.outputs.data() + position[static_cast<std::size_t>(n * k + j)] * H;
      float* o = combined.data() + n * H;
      for (std::int64_t h = 0; h < H; ++h) o[h] += w * row[h];
    }
  be.copy_from_host(out, std::span<const float>(combined));
}

// Writes d loss / d input into dinput and d loss / d w into a.dmoe_weights.
void Model::expert_parallel_backward(std::size_t l, const Tensor& dout_full, const Tensor& dinput) {
  Activations& a = *acts_;
  const Layer& P = layers_[l];
  auto& A = a.layers[l];
  ExpertExchange& X = A.exchange;
  Communicator& ep = *shard_.expert;
  Backend& be = backend_;
  const std::int64_t H = config_.hidden_size, k = config_.moe_router_topk, N = A.routing.tokens;

  std::vector<float> dout(static_cast<std::size_t>(N * H));
  be.copy_to_host(dout_full, dout);
  std::vector<float> dweights(static_cast<std::size_t>(N * k)), send(X.outputs.size());
  for (std::size_t i = 0; i < X.order.size(); ++i) {
    const std::int64_t slot = X.order[i], n = slot / k;
    const float w = A.routing.weights[static_cast<std::size_t>(slot)];
    const float* d = dout.data() + n * H;
    const float* y = X.outputs.data() + static_cast<std::int64_t>(i) * H;
    float* s = send.data() + static_cast<std::int64_t>(i) * H;
    double dot = 0;
    for (std::int64_t h = 0; h < H; ++h) {
      dot += double(d[h]) * y[h];
      s[h] = w * d[h];
    }
    dweights[static_cast<std::size_t>(slot)] = static_cast<float>(dot);
  }
  be.copy_from_host(a.dmoe_weights, std::span<const float>(dweights));

  const auto send_counts = scaled(X.send_rows, H), recv_counts = scaled(X.recv_rows, H);
  std::vector<float> recv(static_cast<std::size_t>(X.received * H)), dx_recv(recv.size());
  ep.all_to_all_v<float>(send, send_counts, recv, recv_counts);
  if (X.received > 0) {
    const std::int64_t M = X.received;
    Tensor dy = be.alloc({M, H}), dx = be.alloc({M, H}), dw = be.alloc({M, 1});
    be.copy_from_host(dy, std::span<const float>(recv));
    be.moe_experts_backward(dy, X.x, X.idx, X.ones, params_[P.experts_fc1].value, params_[P.experts_fc2].value,
                            X.gate_up, X.act, dx, dw, params_[P.experts_fc1].grad, params_[P.experts_fc2].grad);
    be.copy_to_host(dx, dx_recv);
  }
  std::vector<float> dx_rows(send.size());
  ep.all_to_all_v<float>(dx_recv, recv_counts, dx_rows, send_counts);
  std::vector<float> dx(static_cast<std::size_t>(N * H), 0.0f);
  for (std::size_t i = 0; i < X.order.size(); ++i) {
    const std::int64_t n = X.order[i] / k;
    const float* r = dx_rows.data() + static_cast<std::int64_t>(i) * H;
    float* d = dx.data() + n * H;
    for (std::int64_t h = 0; h < H; ++h) d[h] += r[h];
  }
  be.copy_from_host(dinput, std::span<const float>(dx));
}

}  // namespace dlm::train
