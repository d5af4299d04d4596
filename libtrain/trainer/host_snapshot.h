// HostSnapshot: reusable host copies of the state a background save writes (the weights and AdamW moments as they
// stood at the save point), so that training may change the originals while the copies go to disk. One buffer,
// allocated at the first save and kept for the next ones (only the first snapshot pays its page faults); each span
// starts 4 KiB-aligned in it, so the checkpoint writer's O_DIRECT writes from it with no second copy.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

namespace dlm::train {

class HostSnapshot {
 public:
  // Copies `spans` in (on several threads) and returns the copies, in the same order. The copies of the previous
  // call are overwritten: its reader must be done with them.
  std::vector<std::span<const float>> take(const std::vector<std::span<const float>>& spans);
  std::size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> buffer_;
  std::size_t bytes_ = 0;
};

}  // namespace dlm::train
