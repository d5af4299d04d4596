// A CUPTI injection library that records every kernel a process runs, graph-replayed kernels included, with its
// GPU start and end: `CUDA_INJECTION64_PATH=libdlm_kernel_trace.so DLM_KERNEL_TRACE=out.csv program ...` writes
// one CSV line a kernel (start_ns,end_ns,graph_id,graph_node,grid,block,name; the name demangled, commas as ';')
// when the process exits. Used to see
// where a sampling step's time goes between and inside kernels (a profiler that replays kernels one by one with
// flushed caches, as Nsight Compute does, cannot show the gaps of a graph replay).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Kernel {
  unsigned long long start, end, node;
  unsigned graph, grid, block;
  std::string name;
};

std::mutex kernels_mutex;
std::vector<Kernel>* kernels = nullptr;
constexpr std::size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(kernels_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::string name = k->name ? k->name : "?";
    int status = 0;
    if (char* readable = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status)) {
      if (status == 0) name = readable;
      std::free(readable);
    }
    kernels->push_back({k->start, k->end, k->graphNodeId, k->graphId,
                        static_cast<unsigned>(k->gridX * k->gridY * k->gridZ),
                        static_cast<unsigned>(k->blockX * k->blockY * k->blockZ), name});
  }
  std::free(buffer);
}

void write_trace() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("DLM_KERNEL_TRACE");
  FILE* f = std::fopen(path ? path : "kernel_trace.csv", "w");
  if (!f) return;
  std::fprintf(f, "start_ns,end_ns,graph_id,graph_node,grid,block,name\n");
  std::lock_guard<std::mutex> lock(kernels_mutex);
  for (const Kernel& k : *kernels) {
    std::string name = k.name;
    for (char& c : name)
      if (c == ',') c = ';';
    std::fprintf(f, "%llu,%llu,%u,%llu,%u,%u,%s\n", k.start, k.end, k.graph, k.node, k.grid, k.block, name.c_str());
  }
  std::fclose(f);
}

}  // namespace

extern "C" int InitializeInjection() {
  kernels = new std::vector<Kernel>();
  kernels->reserve(1 << 20);
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
  std::atexit(write_trace);
  return 1;
}
