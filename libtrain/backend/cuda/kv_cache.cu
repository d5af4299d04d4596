// The samplers' block KV cache on the device (sampler.h; CudaModel's KvCacheUse): the store of every layer's keys
// and values, and the attention of a window of columns over them.
//   kv_store: K after QK-norm and RoPE (the attention layout's k slots) and V (the QKV projection's grouped layout;
//     V takes no norm and no rotation, so both layouts hold the same values) of every token into
//     [tokens, groups, head_dim], bf16, as they are.
//   window_attention: the queries of columns [first, first + width) of each row b attend to every column c < seq
//     of that row, with K[c] = the window's own (computed in this pass) for c inside the window and the store's
//     otherwise (V alike); bidirectional, no mask (CudaModel runs each padding group without its pad columns), GQA
//     (head h reads group h / (heads / groups)):
//       s_c = q . K[c] / sqrt(d),  o = sum_c e^(s_c - m) V[c] / sum_c e^(s_c - m),  m = max_c s_c.
//     FlashAttention-2's arithmetic (attention.cu's forward): bf16 tensor cores, fp32 scores, max and sum, the
//     probabilities rounded to bf16 for P V. A window is short (a block of 32 columns over a sequence of a few
//     hundred) and a step runs it once per layer, so the kernel is laid out for latency: a block of 4 warps takes
//     16 x QW queries of one (row, head), its warps split the keys KW = 4 / QW ways (each warp a 64 / KW-key slice
//     of every 64-key tile), tiles are staged by cp.async two deep (the next one loads while this one is
//     multiplied), and the warps' partial (m, l, o) are merged in shared memory at the end. QW is the largest of
//     4, 2, 1 that still gives every multiprocessor a block. A grid that still leaves multiprocessors idle (a
//     window of one batch row: 2 x 16 blocks) also splits the key tiles over S <= 8 blocks (flash-decoding), one
//     thread-block cluster: each sends its unnormalised (o, m, l) of query q to block q % S (asynchronous stores into
//     that block's shared memory, counted on its transaction barrier), which merges them as the warps' are merged
//     once its barrier has all the bytes (the splits' tile rounds run side by side instead of one after the other,
//     no second kernel merges them, and no block waits on the cluster's barrier between its tiles and its merge).
//     Where asked (FP8 sampling: an Fp8Out for the projection's input), the kernel that writes o also takes its amax,
//     and with Fp8Out::out set casts o into FP8 with the slot's scale as it stands as well (fp8_cast.h's fused cast).
#include <algorithm>
#include <cfloat>

#include "common.cuh"
#include "fp8_common.cuh"
#include "kernels.h"
#include "mma.cuh"

#include <cooperative_groups.h>

namespace dlm::train::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;  // kv_store

// The larger |value| of the two bf16 of a packed pair (what a store wrote).
__device__ __forceinline__ float abs_max2(std::uint32_t pair) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pair));
  return fmaxf(fabsf(f.x), fabsf(f.y));
}
// A written pair's fused FP8 cast (Fp8Out with out set): the two bf16 values, scaled, into out[at], out[at + 1].
__device__ __forceinline__ void store_fp8x2(std::uint32_t pair, const Fp8Out& f, float scale, std::int64_t at) {
  const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pair));
  const auto q = static_cast<std::uint16_t>(to_fp8(v.x * scale, f.e5m2) | (to_fp8(v.y * scale, f.e5m2) << 8));
  *reinterpret_cast<std::uint16_t*>(f.out + at) = q;
}

__global__ void __launch_bounds__(kThreads)
    kv_store_kernel(const bf16* qkv_rot, const bf16* qkv_raw, int tokens, int heads, int groups, int head_dim,
                    bf16* k, bf16* v) {
  const int vecs = head_dim / 8, per = heads / groups;
  const std::int64_t n = static_cast<std::int64_t>(tokens) * groups * vecs;
  const std::int64_t row = static_cast<std::int64_t>(heads + 2 * groups) * head_dim;
  for (std::int64_t i = blockIdx.x * std::int64_t{kThreads} + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * kThreads) {
    const std::int64_t t = i / (groups * vecs);
    const int g = static_cast<int>(i / vecs % groups), part = static_cast<int>(i % vecs);
    const Bf16x8* ks = reinterpret_cast<const Bf16x8*>(qkv_rot + t * row + (heads + g) * head_dim) + part;
    const Bf16x8* vs = reinterpret_cast<const Bf16x8*>(qkv_raw + t * row + (g * (per + 2) + per + 1) * head_dim) + part;
    reinterpret_cast<Bf16x8*>(k)[i] = *ks;
    reinterpret_cast<Bf16x8*>(v)[i] = *vs;
  }
}

constexpr int kWarps = 4, kWindowThreads = 32 * kWarps;
constexpr int kTile = 64;  // keys staged per round
constexpr int kMaxSplits = 8;  // blocks sharing a query tile's keys: one cluster, of the portable size at most

// 16 bytes global -> shared without passing through registers; zeros when !valid (then src is not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

// Shared memory of a block: two staged tiles of K and V (rows of D + 8, the stride attention.cu's fragments read
// without bank conflicts), reused at the end for each warp's partial o [16][D], m [16] and l [16]; after those, under
// split keys, the block's inbox: the (o, m, l) of the queries it merges, from every block of its cluster
// ([split][slot][D + 2]; at most 64 queries a tile, shared among the splits), apart from the tiles because another
// block may send while this one still multiplies.
template <int D>
__host__ __device__ constexpr std::size_t window_stage_bytes() {
  const std::size_t tiles = std::size_t{2} * 2 * kTile * (D + 8) * sizeof(bf16);
  const std::size_t partials = std::size_t{kWarps} * 16 * ((D + 2) + 2) * sizeof(float);
  return tiles > partials ? tiles : partials;
}
template <int D>
constexpr std::size_t window_smem_bytes() {
  return window_stage_bytes<D>() + std::size_t{64 + kMaxSplits} * (D + 2) * sizeof(float);
}

// The cluster's exchange (sm_90): a block's inbox is filled by the other blocks' asynchronous stores, each counting
// its bytes on the inbox's transaction barrier, so the receiver waits on its own barrier alone.
__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
// The same shared-memory offset in block `rank` of the cluster.
__device__ __forceinline__ std::uint32_t in_block(std::uint32_t address, int rank) {
  std::uint32_t mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(mapped) : "r"(address), "r"(rank));
  return mapped;
}
// (a, b) into another block's shared memory at `to`, its bytes counted on that block's barrier `bar`.
__device__ __forceinline__ void send2(std::uint32_t to, float a, float b, std::uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n" ::"r"(to),
               "f"(a), "f"(b), "r"(bar)
               : "memory");
}
// The inbox barrier, set by one thread: one arrival (its own) and `bytes` to come; visible to the cluster once the
// cluster barrier that follows has been passed.
__device__ __forceinline__ void expect_bytes(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Until every byte the barrier expects has landed (its first phase completes).
__device__ __forceinline__ void wait_bytes(std::uint32_t bar) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n @!done bra WAIT_%=;\n}\n" ::"r"(bar)
      : "memory");
}

// D: head_dim; KW: the ways a block's keys are split (4 / KW warps of 16 queries each).
template <int D, int KW>
__global__ void __launch_bounds__(kWindowThreads)
    window_attention_kernel(WindowAttentionShape s, const int* first_at, const bf16* qkv_rot, const bf16* qkv_raw,
                            const bf16* k_store, const bf16* v_store, bf16* out, float scale2, int splits,
                            int tiles_per_split, Fp8Out out8) {
  constexpr int ST = D + 8, QW = kWarps / KW, BW = kTile / KW;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* const staged = reinterpret_cast<bf16*>(smem);  // [buffer][K, V][kTile][ST]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, c = lane % 4;
  const int h = blockIdx.y, b = blockIdx.z, per = s.heads / s.groups, g = h / per;
  const int qi = warp / KW, ks = warp % KW;  // the warp's 16 queries and its slice of each tile's keys
  const std::int64_t ld = static_cast<std::int64_t>(s.heads + 2 * s.groups) * D;  // a QKV row, either layout
  const std::int64_t row0 = static_cast<std::int64_t>(b) * s.width;              // sequence b's first window row
  const int split = blockIdx.x % splits;                                             // its key tiles' share
  const int block_j = blockIdx.x / splits * 16 * QW, j0 = block_j + qi * 16;         // window columns
  const bool busy = j0 < s.width;
  const int first = *first_at;
  const float scale8 = fused_fp8_scale(out8);
  // Split keys: the inbox's barrier expects the other blocks' (o, m, l) of the queries this block merges (query q of
  // the tile goes to block q % splits, slot q / splits), set before the cluster's first barrier, which the blocks pass
  // before they send.
  __shared__ alignas(8) std::uint64_t inbox_full;
  constexpr int kRows = QW * 16;
  const int rank = splits > 1 ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  const int slots = (kRows + splits - 1) / splits, mine = (kRows - rank + splits - 1) / splits;
  if (splits > 1) {
    if (threadIdx.x == 0)
      expect_bytes(shared_address(&inbox_full),
                   static_cast<std::uint32_t>((splits - 1) * mine * (D + 2) * static_cast<int>(sizeof(float))));
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
  }
  // Keys [c0, c0 + kTile) of K and V into buffer `buf`: the window's own inside it, the store's elsewhere, zeros
  // past the sequence. A thread stages one row of K or V (kWindowThreads = 2 kTile): its source found once, then its
  // D / 8 chunks (the kernel is latency-bound, so few instructions before the wait matter more than whole sectors
  // per request).
  static_assert(kWindowThreads == 2 * kTile);
  const auto stage = [&](int c0, int buf) {
    const int is_v = threadIdx.x / kTile, r = threadIdx.x % kTile, col = c0 + r;
    const bool live = col < s.seq, own = col >= first && col < first + s.width;
    const bf16* src;
    if (own) {
      const std::int64_t at = (row0 + col - first) * ld;
      src = is_v ? qkv_raw + at + static_cast<std::int64_t>(g * (per + 2) + per + 1) * D
                 : qkv_rot + at + static_cast<std::int64_t>(s.heads + g) * D;
    } else {
      src = (is_v ? v_store : k_store) +
            ((static_cast<std::int64_t>(b) * s.seq + (live ? col : 0)) * s.groups + g) * D;
    }
    bf16* dst = staged + (buf * 2 + is_v) * kTile * ST + r * ST;
#pragma unroll
    for (int part = 0; part < D; part += 8) cp_async16(dst + part, src + part, live);
    cp_async_commit();
  };
  const int t_begin = split * tiles_per_split;
  const int t_end = min((s.seq + kTile - 1) / kTile, t_begin + tiles_per_split);  // never empty (window_split)
  // The warp's queries as A fragments, straight from the window's rows (past the window: its last row, computed
  // and never written); loaded before the first tile is staged, so that their loads are in flight during it.
  std::uint32_t qf[D / 16][4];
  {
    const bf16* lo = qkv_rot + (row0 + min(j0 + gr, s.width - 1)) * ld + static_cast<std::int64_t>(h) * D;
    const bf16* hi = qkv_rot + (row0 + min(j0 + gr + 8, s.width - 1)) * ld + static_cast<std::int64_t>(h) * D;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      qf[kc][0] = ld32(lo + kc * 16 + 2 * c);
      qf[kc][1] = ld32(hi + kc * 16 + 2 * c);
      qf[kc][2] = ld32(lo + kc * 16 + 8 + 2 * c);
      qf[kc][3] = ld32(hi + kc * 16 + 8 + 2 * c);
    }
  }
  stage(t_begin * kTile, 0);
  float acc[D / 8][4] = {};
  float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.0f, 0.0f};
  for (int t = t_begin; t < t_end; ++t) {
    const int buf = (t - t_begin) & 1;
    if (t + 1 < t_end) stage((t + 1) * kTile, buf ^ 1);
    else cp_async_commit();  // an empty group: tile t is then always the second newest
    cp_async_wait<1>();
    __syncthreads();  // tile t is in shared memory for every warp
    if (busy) {
      const bf16* sk = staged + buf * 2 * kTile * ST + ks * BW * ST;  // the warp's slice
      const bf16* sv = sk + kTile * ST;
      const int k0 = t * kTile + ks * BW;
      float sc[BW / 8][4];
      tile_scores<BW, D, true>(sc, qf, sk, ST, gr, c);
#pragma unroll
      for (int nt = 0; nt < BW / 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          sc[nt][i] = k0 + nt * 8 + 2 * c + (i & 1) >= s.seq ? -INFINITY : sc[nt][i] * scale2;
      online_softmax<BW, D>(sc, m, l, acc);
      accumulate_pv<BW, D, true>(acc, sc, sv, ST, gr, c);
    }
    __syncthreads();  // every warp is done with buffer `buf` before stage() refills it
  }
  cp_async_wait<0>();  // the trailing empty group
  // Each warp's (m, l, o) of its rows, then per query the merge over the KW warps that share it:
  //   M = max_w m_w,  o = sum_w e^(m_w - M) o_w / sum_w e^(m_w - M) l_w.
  // A warp whose slices held no key has m = -FLT_MAX, l = 0, o = 0 and weighs nothing.
  float* const po = reinterpret_cast<float*>(smem);  // [warp][16][D + 2]
  float* const pm = po + kWarps * 16 * (D + 2);      // [warp][16]
  float* const pl = pm + kWarps * 16;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int q = warp * 16 + gr + 8 * r;
    if (c == 0) pm[q] = m[r], pl[q] = l[r];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
      *reinterpret_cast<float2*>(po + q * (D + 2) + nt * 8 + 2 * c) = make_float2(acc[nt][2 * r], acc[nt][2 * r + 1]);
  }
  __syncthreads();
  // A query's normalised o written (bf16, and where asked its FP8 cast and amax).
  float amax = 0.0f;  // of the values written (out8)
  const auto emit = [&](std::int64_t at, int d, float o0, float o1, float sum) {
    const float inv = 1.0f / sum;
    const std::uint32_t o = pack(o0 * inv, o1 * inv);
    if (out) *reinterpret_cast<std::uint32_t*>(out + at * D + d) = o;
    if (out8.amax) amax = fmaxf(amax, abs_max2(o));
    if (out8.out) store_fp8x2(o, out8, scale8, at * D + d);
  };
  // Split keys: [split][slot][D + 2], slot s of split k holding block k's (o unnormalised, m, l) of query
  // s * splits + rank.
  float* const inbox = reinterpret_cast<float*>(smem + window_stage_bytes<D>());
  const std::uint32_t inbox_at = shared_address(inbox), bar = shared_address(&inbox_full);
  if (splits > 1) asm volatile("barrier.cluster.wait;\n" ::: "memory");  // every inbox's barrier is set
  // The block's QW x 16 queries, kTpr threads each: a query's weights e^(m_w - M) and sum found once, then its
  // kPairs pairs of head dimensions (pair p0 + i kTpr: a warp's threads read neighbouring pairs). Under split keys
  // each is sent to the block that merges its query, a query past the window too (its bytes are expected).
  constexpr int kTpr = kWindowThreads / kRows, kPairs = D / 2 / kTpr;
  static_assert(kWindowThreads % kRows == 0 && (D / 2) % kTpr == 0);
  {
    const int q = threadIdx.x / kTpr, p0 = threadIdx.x % kTpr, j = block_j + q;
    const int to = q % splits;
    const std::uint32_t own = inbox_at + static_cast<std::uint32_t>(((rank * slots + q / splits) * (D + 2)) * 4);
    const std::uint32_t to_at = to == rank ? own : in_block(own, to), to_bar = to == rank ? bar : in_block(bar, to);
    const auto keep = [&](int d, float a, float b) {
      if (to == rank) *reinterpret_cast<float2*>(inbox + (rank * slots + q / splits) * (D + 2) + d) = make_float2(a, b);
      else send2(to_at + static_cast<std::uint32_t>(d * 4), a, b, to_bar);
    };
    const bool live = j < s.width;
    if (live || splits > 1) {
      const int w0 = (q / 16) * KW, rr = q % 16;  // the query's first warp and its row there
      float top = -FLT_MAX;
#pragma unroll
      for (int k = 0; k < KW; ++k) top = fmaxf(top, pm[(w0 + k) * 16 + rr]);
      float e[KW], sum = 0.0f;
#pragma unroll
      for (int k = 0; k < KW; ++k) {
        const int q_at = (w0 + k) * 16 + rr;
        e[k] = exp2f(pm[q_at] - top);
        sum += e[k] * pl[q_at];
      }
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        const int d = 2 * (p0 + i * kTpr);
        float o0 = 0.0f, o1 = 0.0f;
#pragma unroll
        for (int k = 0; k < KW; ++k) {
          const float2 o = *reinterpret_cast<const float2*>(po + ((w0 + k) * 16 + rr) * (D + 2) + d);
          o0 += e[k] * o.x, o1 += e[k] * o.y;
        }
        if (splits > 1) keep(d, o0, o1);
        else emit((row0 + j) * s.heads + h, d, o0, o1, sum);
      }
      if (splits > 1 && p0 == 0) keep(D, top, sum);
    }
  }
  if (splits > 1) {
    // The query tile's S splits are one cluster: each block merges its queries from its inbox,
    // M = max_s m_s, o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
    __syncthreads();      // its own share is in the inbox
    wait_bytes(bar);      // and every other block's
    for (int i = threadIdx.x; i < mine * (D / 2); i += kWindowThreads) {
      const int slot = i / (D / 2), d = 2 * (i % (D / 2)), q = slot * splits + rank, j = block_j + q;
      if (j >= s.width) continue;
      float2 ml[kMaxSplits], ov[kMaxSplits];
#pragma unroll
      for (int k = 0; k < kMaxSplits; ++k)
        if (k < splits) {
          const float* pp = inbox + (k * slots + slot) * (D + 2);
          ml[k] = *reinterpret_cast<const float2*>(pp + D), ov[k] = *reinterpret_cast<const float2*>(pp + d);
        }
      float top = -FLT_MAX;
#pragma unroll
      for (int k = 0; k < kMaxSplits; ++k)
        if (k < splits) top = fmaxf(top, ml[k].x);
      float sum = 0.0f, o0 = 0.0f, o1 = 0.0f;
#pragma unroll
      for (int k = 0; k < kMaxSplits; ++k)
        if (k < splits) {
          const float e = exp2f(ml[k].x - top);
          sum += e * ml[k].y, o0 += e * ov[k].x, o1 += e * ov[k].y;
        }
      emit((row0 + j) * s.heads + h, d, o0, o1, sum);
    }
    // No block leaves before every block has its inbox: what it sent has landed. Relaxed: nothing of its own needs
    // ordering before it arrives (a release would cost a memory barrier).
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
    asm volatile("barrier.cluster.wait;\n" ::: "memory");
  }
  fused_fp8_commit(amax, out8);
}

// How the key tiles are split over blocks: `splits` blocks of `per` tiles each, none empty.
struct KeySplit {
  int splits, per;
};

template <int D, int KW>
void launch_window(const WindowAttentionShape& s, KeySplit ks, const int* first, const bf16* qkv_rot,
                   const bf16* qkv_raw, const bf16* k_store, const bf16* v_store, bf16* out, Fp8Out out8,
                   cudaStream_t stream) {
  constexpr std::size_t smem = window_smem_bytes<D>();
  const auto kernel = window_attention_kernel<D, KW>;
  if (smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
               "window attention: shared memory limit");
  const int queries = 16 * (kWarps / KW);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3((s.width + queries - 1) / queries * ks.splits, s.heads, s.batch);
  config.blockDim = dim3(kWindowThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  // A query tile's splits are one cluster (consecutive blocks along x: the block's rank is its split).
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(ks.splits), cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster, config.numAttrs = 1;
  const float scale2 = kLog2e / sqrtf(static_cast<float>(D));
  check_cuda(cudaLaunchKernelEx(&config, kernel, s, first, qkv_rot, qkv_raw, k_store, v_store, out, scale2, ks.splits,
                                ks.per, out8),
             "window attention");
}

template <int D>
void window_d(const WindowAttentionShape& s, int query_warps, KeySplit ks, const int* first, const bf16* qkv_rot,
              const bf16* qkv_raw, const bf16* k_store, const bf16* v_store, bf16* out, Fp8Out out8,
              cudaStream_t stream) {
  switch (query_warps) {
    case 4: return launch_window<D, 1>(s, ks, first, qkv_rot, qkv_raw, k_store, v_store, out, out8, stream);
    case 2: return launch_window<D, 2>(s, ks, first, qkv_rot, qkv_raw, k_store, v_store, out, out8, stream);
    default: return launch_window<D, 4>(s, ks, first, qkv_rot, qkv_raw, k_store, v_store, out, out8, stream);
  }
}

// The largest query tile (in warps of 16) that still gives every multiprocessor a block.
int window_query_warps(const WindowAttentionShape& s) {
  const std::int64_t tiles = (s.width + 15) / 16, row_heads = static_cast<std::int64_t>(s.batch) * s.heads;
  for (int qw : {4, 2})
    if (qw <= tiles && row_heads * ((tiles + qw - 1) / qw) >= multiprocessors()) return qw;
  return 1;
}

// At most `want` splits (0: as many as fill the multiprocessors with the query tiles' blocks, 1 where those alone
// do) and at most kMaxSplits, each of the same whole number of tiles, none empty.
KeySplit window_split(const WindowAttentionShape& s, int query_warps, int want) {
  const int tiles = (s.seq + kTile - 1) / kTile;
  if (want <= 0) {
    const std::int64_t blocks =
        static_cast<std::int64_t>(s.batch) * s.heads * ((s.width + 16 * query_warps - 1) / (16 * query_warps));
    want = blocks >= multiprocessors() ? 1 : static_cast<int>((multiprocessors() + blocks - 1) / blocks);
  }
  want = std::max(1, std::min({want, tiles, kMaxSplits}));
  const int per = (tiles + want - 1) / want;
  return {(tiles + per - 1) / per, per};
}

}  // namespace

void kv_store(const bf16* qkv_rot, const bf16* qkv_raw, int tokens, int heads, int groups, int head_dim, bf16* k,
              bf16* v, cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(tokens) * groups * (head_dim / 8);
  if (n <= 0) return;
  const int blocks = static_cast<int>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, 16 * multiprocessors()));
  kv_store_kernel<<<blocks, kThreads, 0, stream>>>(qkv_rot, qkv_raw, tokens, heads, groups, head_dim, k, v);
}

void window_attention(const WindowAttentionShape& s, const int* first, const bf16* qkv_rot, const bf16* qkv_raw,
                      const bf16* k_store, const bf16* v_store, bf16* out, cudaStream_t stream, int query_warps,
                      int key_splits, const Fp8Out* fp8) {
  if (s.batch <= 0 || s.width <= 0) return;
  const Fp8Out out8 = fp8 ? *fp8 : Fp8Out{};
  const int qw = query_warps > 0 ? query_warps : window_query_warps(s);
  const KeySplit ks = window_split(s, qw, key_splits);
  switch (s.head_dim) {
    case 16: return window_d<16>(s, qw, ks, first, qkv_rot, qkv_raw, k_store, v_store, out, out8, stream);
    case 32: return window_d<32>(s, qw, ks, first, qkv_rot, qkv_raw, k_store, v_store, out, out8, stream);
    case 64: return window_d<64>(s, qw, ks, first, qkv_rot, qkv_raw, k_store, v_store, out, out8, stream);
    case 128: return window_d<128>(s, qw, ks, first, qkv_rot, qkv_raw, k_store, v_store, out, out8, stream);
    default: return;  // the model refuses other head sizes (attention.cu's set) before it gets here
  }
}

}  // namespace dlm::train::cuda
