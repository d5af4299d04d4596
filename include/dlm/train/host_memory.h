// The process's host memory (Linux /proc/self/status and glibc's malloc statistics), as --log-memory-to-tensorboard
// reports it for a model trained on the CPU (training_monitor.h's MemoryReport):
//   mem-reserved-bytes       resident set (VmRSS): the memory the process holds
//   mem-allocated-bytes      bytes in use by malloc (mallinfo2: uordblks + hblkhd)
//   mem-max-allocated-bytes  peak resident set (VmHWM)
#pragma once

#include <cstdint>

namespace dlm::train {

struct HostMemory {
  std::int64_t resident_bytes = 0, peak_resident_bytes = 0, malloc_bytes = 0;
};

HostMemory host_memory();

}  // namespace dlm::train
