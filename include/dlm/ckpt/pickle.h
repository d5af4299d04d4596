// A restricted unpickler for the Python pickles torch.save and torch.distributed.checkpoint write
// (protocols 2-5). It builds values, never runs code: a pickle is a program for a stack machine whose
// GLOBAL opcodes name Python callables, and only the globals below are accepted; any other is refused
// by name ("pickle names global os.system, which dlm does not load").
//
//   collections.OrderedDict, builtins.set/frozenset  -> kDict / kList
//   argparse.Namespace, types.SimpleNamespace         -> kDict of their attributes
//   torch._utils._rebuild_tensor(_v2), _rebuild_parameter(_with_state)
//                                                     -> kTensor (a view of a persistent-id storage)
//   torch.<Type>Storage, torch.<dtype>, torch.Size, torch layouts and memory formats,
//   numpy's array reconstruction, enums and dataclasses megatron-core registers as safe globals
//   (megatron/core/safe_globals.py), the torch.distributed.checkpoint metadata classes
//                                                     -> kObject: the class name, its call arguments and
//                                                        its BUILD state, as data
// Persistent ids (torch's storages: ('storage', torch.FloatStorage, key, location, numel)) become
// kStorage values. Errors are dlm::Error naming the file and the byte offset of the opcode.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dlm::ckpt {

// torch's element types as the storage classes name them.
enum class TorchDType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kInt16, kInt8, kUInt8, kBool };
std::size_t torch_dtype_size(TorchDType dtype);
std::string_view torch_dtype_name(TorchDType dtype);

struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict, kGlobal, kStorage, kTensor, kObject };
  Kind kind = Kind::kNone;
  bool b = false;
  std::int64_t i = 0;
  double f = 0.0;
  std::string s;  // kString, kBytes; kGlobal / kObject: "module.name"; kStorage: the storage key
  std::vector<const PickleValue*> items;                                   // kList, kTuple
  std::vector<std::pair<const PickleValue*, const PickleValue*>> entries;  // kDict, in insertion order
  // kStorage: dtype and element count. kTensor: the storage, offset, sizes and strides in elements.
  TorchDType dtype = TorchDType::kFloat32;
  std::int64_t numel = 0, storage_offset = 0;
  const PickleValue* storage = nullptr;
  std::vector<std::int64_t> shape, stride;
  const PickleValue* args = nullptr;   // kObject: the call's arguments (a tuple)
  const PickleValue* state = nullptr;  // kObject: what BUILD gave it (nullptr when none)

  bool is(Kind k) const { return kind == k; }
  // kDict with string keys: the value of `key`, or nullptr.
  const PickleValue* get(std::string_view key) const;
};

// The values of one pickle; they live as long as this object (values may share and even cycle).
class Pickle {
 public:
  const PickleValue& root() const { return *root_; }
  PickleValue* make(PickleValue::Kind kind);

 private:
  friend Pickle unpickle(std::span<const std::uint8_t>, const std::string&);
  std::vector<std::unique_ptr<PickleValue>> values_;
  const PickleValue* root_ = nullptr;
};

// Runs the restricted machine over `bytes`; `file` names the input in errors.
Pickle unpickle(std::span<const std::uint8_t> bytes, const std::string& file);

}  // namespace dlm::ckpt
