// The process's host memory (include/dlm/train/host_memory.h).
#include "dlm/train/host_memory.h"

#include <malloc.h>

#include <fstream>
#include <sstream>
#include <string>

namespace dlm::train {

HostMemory host_memory() {
  HostMemory m;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    std::istringstream words(line);
    std::string key;
    std::int64_t kib = 0;
    words >> key >> kib;
    if (key == "VmRSS:") m.resident_bytes = kib * 1024;
    if (key == "VmHWM:") m.peak_resident_bytes = kib * 1024;
  }
  const struct mallinfo2 info = mallinfo2();
  m.malloc_bytes = static_cast<std::int64_t>(info.uordblks + info.hblkhd);
  return m;
}

}  // namespace dlm::train
