// libFuzzer: the restricted unpickler and torch.save's zip reader on arbitrary bytes. Input starting with
// "PK" is opened as a torch.save file and every tensor of its root dict is copied out; anything else is
// unpickled. Must reject with dlm::Error or return values whose tensors lie inside their storages.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "dlm/ckpt/pickle.h"
#include "dlm/ckpt/torch_file.h"
#include "dlm/common/error.h"
#include "fuzz_util.h"

namespace {

// Visits values to a bounded depth (pickles may hold cycles); checks each tensor's invariants.
void walk(const dlm::ckpt::PickleValue& v, int depth) {
  using Kind = dlm::ckpt::PickleValue::Kind;
  if (depth > 64) return;
  if (v.is(Kind::kTensor) && (v.shape.size() != v.stride.size() || !v.storage)) std::abort();
  for (const auto* x : v.items) walk(*x, depth + 1);
  for (const auto& [k, x] : v.entries) {
    walk(*k, depth + 1);
    walk(*x, depth + 1);
  }
  if (v.args) walk(*v.args, depth + 1);
  if (v.state) walk(*v.state, depth + 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
      const std::string path = dlm::fuzz::write_temp("fuzz.pt", {reinterpret_cast<const char*>(data), size});
      const dlm::ckpt::TorchFile f(path);
      walk(f.root(), 0);
      for (const auto& [k, v] : f.root().entries)
        if (v->is(dlm::ckpt::PickleValue::Kind::kTensor)) {
          try {
            const auto t = f.tensor(*v, "t");
            if (t.numel() != dlm::ckpt::element_count(v->shape)) std::abort();
          } catch (const dlm::Error&) {
          }
        }
    } else {
      const auto p = dlm::ckpt::unpickle(std::span<const std::uint8_t>(data, size), "fuzz.pkl");
      walk(p.root(), 0);
    }
  } catch (const dlm::Error&) {
  }
  return 0;
}
