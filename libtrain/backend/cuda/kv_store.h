// The samplers' block KV cache on the device (CudaModel's KvCacheUse): per layer, the keys and values of every
// token of the batch a storing forward ran, and how a forward uses them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "device_arena.h"
#include "kernels.h"

namespace dlm::train::cuda {

// K and V of each layer, [batch, seq, groups, head_dim] bf16.
struct KvStore {
  std::int64_t batch = 0, seq = 0;
  std::vector<bf16*> k, v;  // per layer
  // The first column of the window a forward runs over the store, on the device (window_attention reads it there,
  // so one captured window forward serves every position of its width) and the host value last copied there (the
  // copy's source, alive as long as the store).
  int* first = nullptr;
  int first_host = 0;
  // FP8 sampling: the storing forward's GEMM input scales, with which the windows over the store cast theirs
  // (Fp8Linears::keep_input_scales); null without FP8.
  Fp8Slot* fp8_input_scales = nullptr;
  // Which allocation this is (never reused): a captured forward that read an older one's pointers never matches.
  std::uint64_t serial = 0;
  DeviceArena arena;
};

// The stores by the caller's name (KvCacheUse::store).
struct KvStores {
  std::map<int, std::unique_ptr<KvStore>> by_name;
  std::uint64_t serial = 0;
};

// A forward's use of a store: keep every layer's K and V in it (width 0), or run the window columns
// [first, first + width) of each of its rows over it.
struct KvPass {
  KvStore* store = nullptr;
  int first = 0, width = 0;
  bool window() const { return width > 0; }
  std::int64_t rows() const { return store->batch * width; }
};

}  // namespace dlm::train::cuda
