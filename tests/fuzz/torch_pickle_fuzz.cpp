// libFuzzer: the restricted unpickler and torch.save's zip reader on arbitrary bytes. Input starting with
// "PK" is opened as a torch.save file and every tensor of its root dict is copied out; anything else is
// unpickled. Must reject with dlm::Error or return values whose tensors lie inside their storages.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <unordered_set>

#include "dlm/ckpt/pickle.h"
#include "dlm/ckpt/torch_file.h"
#include "dlm/common/error.h"
#include "fuzz_util.h"
#include "../../libckpt/megatron/megatron_args.h"

namespace {

// Visits each value once (pickles share values through the memo, and may cycle); checks each tensor's
// invariants.
void walk(const dlm::ckpt::PickleValue& v, std::unordered_set<const dlm::ckpt::PickleValue*>& seen) {
  using Kind = dlm::ckpt::PickleValue::Kind;
  if (!seen.insert(&v).second) return;
  if (v.is(Kind::kTensor) && (v.shape.size() != v.stride.size() || !v.storage)) std::abort();
  for (const auto* x : v.items) walk(*x, seen);
  for (const auto& [k, x] : v.entries) {
    walk(*k, seen);
    walk(*x, seen);
  }
  if (v.args) walk(*v.args, seen);
  if (v.state) walk(*v.state, seen);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
      const std::string path = dlm::fuzz::write_temp("fuzz.pt", {reinterpret_cast<const char*>(data), size});
      const dlm::ckpt::TorchFile f(path);
      std::unordered_set<const dlm::ckpt::PickleValue*> seen;
      walk(f.root(), seen);
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
      if (dlm::ckpt::detail::pickle_to_json(p.root()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size() > (std::size_t{64} << 20)) std::abort();
      std::unordered_set<const dlm::ckpt::PickleValue*> seen;
      walk(p.root(), seen);
    }
  } catch (const dlm::Error&) {
  }
  return 0;
}
