// The restricted unpickler (pickle.h): Python's pickle machine (Lib/pickle.py, _Unpickler) for the
// opcodes of protocols 2-5, with GLOBAL resolved against a fixed table instead of importing anything.
#include "dlm/ckpt/pickle.h"

#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::ckpt {

using Kind = PickleValue::Kind;

std::size_t torch_dtype_size(TorchDType d) {
  switch (d) {
    case TorchDType::kFloat64: case TorchDType::kInt64: return 8;
    case TorchDType::kFloat32: case TorchDType::kInt32: return 4;
    case TorchDType::kFloat16: case TorchDType::kBFloat16: case TorchDType::kInt16: return 2;
    default: return 1;
  }
}

std::string_view torch_dtype_name(TorchDType d) {
  static constexpr std::string_view names[] = {"float32", "float64", "float16", "bfloat16", "int64",
                                               "int32",   "int16",   "int8",    "uint8",    "bool"};
  return names[static_cast<int>(d)];
}

const PickleValue* PickleValue::get(std::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : entries)
    if (k->kind == Kind::kString && k->s == key) return v;
  return nullptr;
}

PickleValue* Pickle::make(Kind kind) {
  values_.push_back(std::make_unique<PickleValue>());
  values_.back()->kind = kind;
  return values_.back().get();
}

namespace {

enum class Role { kDict, kNamespace, kSet, kBytesFromLatin1, kSize, kRebuildTensor, kRebuildTensorV1, kRebuildParameter, kRebuildFromType, kStorage, kConstant, kObject };

struct Known {
  Role role;
  TorchDType dtype = TorchDType::kFloat32;
};

// Every global a pickle may name. Anything else is refused before it is used.
const std::unordered_map<std::string, Known>& known_globals() {
  static const std::unordered_map<std::string, Known> table = [] {
    std::unordered_map<std::string, Known> t{
        {"collections.OrderedDict", {Role::kDict}},
        {"argparse.Namespace", {Role::kNamespace}},
        {"types.SimpleNamespace", {Role::kNamespace}},
        {"builtins.set", {Role::kSet}},
        {"builtins.frozenset", {Role::kSet}},
        {"_codecs.encode", {Role::kBytesFromLatin1}},  // how protocol 2 spells a bytes object
        {"torch.Size", {Role::kSize}},
        {"torch._utils._rebuild_tensor_v2", {Role::kRebuildTensor}},
        {"torch._utils._rebuild_tensor", {Role::kRebuildTensorV1}},
        {"torch._utils._rebuild_parameter", {Role::kRebuildParameter}},
        {"torch._utils._rebuild_parameter_with_state", {Role::kRebuildParameter}},
        // A tensor with Python attributes (megatron's fp32 masters carry tensor_model_parallel, ...):
        // _rebuild_from_type_v2(rebuild function, torch.Tensor, its arguments, the attributes).
        {"torch._tensor._rebuild_from_type_v2", {Role::kRebuildFromType}},
        {"torch.Tensor", {Role::kConstant}},
        {"torch.nn.parameter.Parameter", {Role::kConstant}},
    };
    const std::pair<const char*, TorchDType> storages[] = {
        {"Float", TorchDType::kFloat32}, {"Double", TorchDType::kFloat64}, {"Half", TorchDType::kFloat16},
        {"BFloat16", TorchDType::kBFloat16}, {"Long", TorchDType::kInt64}, {"Int", TorchDType::kInt32},
        {"Short", TorchDType::kInt16}, {"Char", TorchDType::kInt8}, {"Byte", TorchDType::kUInt8}, {"Bool", TorchDType::kBool}};
    for (const auto& [prefix, dtype] : storages) t[fmt::format("torch.{}Storage", prefix)] = {Role::kStorage, dtype};
    for (const char* c : {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
                          "float", "half", "double", "long", "int", "strided", "sparse_coo", "contiguous_format",
                          "channels_last", "preserve_format"})
      t[fmt::format("torch.{}", c)] = {Role::kConstant};
    // Data-only classes, kept as kObject: numpy arrays (RNG states), and megatron-core's safe globals.
    for (const char* c : {"numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray",
                          "numpy.dtype", "numpy.dtypes.UInt32DType", "numpy.core.multiarray.scalar",
                          "numpy._core.multiarray.scalar", "pathlib.PosixPath", "io.BytesIO", "signal.Signals", "torch.device",
                          "megatron.core.enums.ModelType", "megatron.core.transformer.enums.AttnBackend",
                          "megatron.core.transformer.enums.CudaGraphScope", "megatron.core.optimizer.optimizer_config.OptimizerConfig",
                          "megatron.core.rerun_state_machine.RerunDiagnostic", "megatron.core.rerun_state_machine.RerunMode",
                          "megatron.core.rerun_state_machine.RerunState",
                          "torch.distributed.checkpoint.metadata.Metadata", "torch.distributed.checkpoint.metadata.StorageMeta",
                          "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
                          "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
                          "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
                          "torch.distributed.checkpoint.metadata.TensorProperties",
                          "torch.distributed.checkpoint.metadata.MetadataIndex",
                          "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
                          "torch.distributed.checkpoint.filesystem._StorageInfo",
                          "torch.distributed.checkpoint.planner.SavePlan", "torch.distributed.checkpoint.planner.WriteItem",
                          "torch.distributed.checkpoint.planner.WriteItemType",
                          "torch.distributed.checkpoint.planner.TensorWriteData", "torch.serialization._get_layout"})
      t[c] = {Role::kObject};
    return t;
  }();
  return table;
}

class Machine {
 public:
  Machine(std::span<const std::uint8_t> bytes, const std::string& file, Pickle& out) : in_(bytes), file_(file), out_(out) {}

  const PickleValue* run();

 private:
  [[noreturn]] void bad(const std::string& what) const { fail_at_offset(file_, op_at_, what); }
  const std::uint8_t* take(std::size_t n) {
    if (n > in_.size() - at_) bad(fmt::format("pickle is truncated (opcode needs {} more bytes, {} left)", n, in_.size() - at_));
    const std::uint8_t* p = in_.data() + at_;
    at_ += n;
    return p;
  }
  std::uint64_t le(std::size_t n) {
    const std::uint8_t* p = take(n);
    std::uint64_t v = 0;
    for (std::size_t k = 0; k < n; ++k) v |= std::uint64_t{p[k]} << (8 * k);
    return v;
  }
  std::string text(std::size_t n) {
    const std::uint8_t* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  std::string line() {
    std::string s;
    for (;;) {
      const char c = static_cast<char>(*take(1));
      if (c == '\n') return s;
      s += c;
    }
  }
  PickleValue* pop() {
    if (stack_.size() <= floor()) bad("pickle pops an empty stack");
    PickleValue* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PickleValue* top() {
    if (stack_.size() <= floor()) bad("pickle reads an empty stack");
    return stack_.back();
  }
  std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<PickleValue*> pop_to_mark() {
    if (marks_.empty()) bad("pickle has no MARK to pop to");
    std::vector<PickleValue*> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  PickleValue* push(PickleValue* v) {
    stack_.push_back(v);
    return v;
  }
  PickleValue* make(Kind k) { return out_.make(k); }
  PickleValue* integer(std::int64_t i) {
    PickleValue* v = make(Kind::kInt);
    v->i = i;
    return v;
  }
  PickleValue* long_int(std::size_t n) {
    if (n > 8) bad(fmt::format("integer of {} bytes is wider than 64 bits", n));
    const std::uint8_t* p = take(n);
    std::uint64_t u = 0;
    for (std::size_t k = 0; k < n; ++k) u |= std::uint64_t{p[k]} << (8 * k);
    if (n > 0 && n < 8 && (p[n - 1] & 0x80)) u |= ~std::uint64_t{0} << (8 * n);  // sign-extend
    return integer(static_cast<std::int64_t>(u));
  }
  PickleValue* string_value(Kind k, std::size_t n) {
    PickleValue* v = make(k);
    v->s = text(n);
    return v;
  }
  PickleValue* tuple(std::vector<PickleValue*> items) {
    PickleValue* t = make(Kind::kTuple);
    t->items.assign(items.begin(), items.end());
    return t;
  }
  void global(const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    if (!known_globals().count(full)) bad(fmt::format("pickle names global {}, which dlm does not load", full));
    PickleValue* g = make(Kind::kGlobal);
    g->s = full;
    push(g);
  }
  void set_items(PickleValue* dict, const std::vector<PickleValue*>& kv) {
    if (dict->kind != Kind::kDict) bad("pickle sets items on a value that is not a dict");
    if (kv.size() % 2) bad("pickle sets items from an odd number of values");
    for (std::size_t k = 0; k < kv.size(); k += 2) dict->entries.emplace_back(kv[k], kv[k + 1]);
  }
  void append(PickleValue* list, const std::vector<PickleValue*>& items) {
    if (list->kind != Kind::kList) bad("pickle appends to a value that is not a list");
    list->items.insert(list->items.end(), items.begin(), items.end());
  }
  void memo_put(std::uint64_t key) {
    if (memo_.size() > in_.size()) bad("pickle memo grows past its input");
    memo_[key] = top();
  }
  void memo_get(std::uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) bad(fmt::format("pickle reads memo entry {} that was never stored", key));
    push(it->second);
  }
  std::vector<std::int64_t> ints(const PickleValue* v, const char* what);
  PickleValue* call(const PickleValue* callable, const PickleValue* args, const PickleValue* kwargs);
  PickleValue* rebuild_tensor(const PickleValue* args, bool v2);
  void build(PickleValue* obj, PickleValue* state);
  void persistent(const PickleValue* pid);

  std::span<const std::uint8_t> in_;
  const std::string& file_;
  Pickle& out_;
  std::size_t at_ = 0, op_at_ = 0;
  std::vector<PickleValue*> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, PickleValue*> memo_;
};

std::vector<std::int64_t> Machine::ints(const PickleValue* v, const char* what) {
  if (v->kind != Kind::kTuple && v->kind != Kind::kList) bad(fmt::format("tensor {} is not a tuple", what));
  std::vector<std::int64_t> out;
  for (const PickleValue* x : v->items) {
    if (x->kind != Kind::kInt || x->i < 0) bad(fmt::format("tensor {} holds something other than a non-negative integer", what));
    out.push_back(x->i);
  }
  return out;
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]);
// _rebuild_tensor(storage, storage_offset, size, stride).
PickleValue* Machine::rebuild_tensor(const PickleValue* args, bool v2) {
  if (args->items.size() < (v2 ? 6u : 4u)) bad("tensor rebuild call has too few arguments");
  const PickleValue* storage = args->items[0];
  if (storage->kind != Kind::kStorage) bad("tensor rebuild call without a storage");
  if (args->items[1]->kind != Kind::kInt || args->items[1]->i < 0) bad("tensor storage offset is not a non-negative integer");
  PickleValue* t = make(Kind::kTensor);
  t->storage = storage;
  t->dtype = storage->dtype;
  t->storage_offset = args->items[1]->i;
  t->shape = ints(args->items[2], "size");
  t->stride = ints(args->items[3], "stride");
  if (t->shape.size() != t->stride.size()) bad("tensor size and stride differ in length");
  // The last element it reaches must lie inside the storage (an empty tensor reaches nothing).
  std::uint64_t last = static_cast<std::uint64_t>(t->storage_offset), step = 0;
  bool empty = false, overflow = false;
  for (std::size_t d = 0; d < t->shape.size(); ++d) {
    if (t->shape[d] == 0) empty = true;
    else overflow |= __builtin_mul_overflow(static_cast<std::uint64_t>(t->shape[d] - 1), static_cast<std::uint64_t>(t->stride[d]), &step) ||
                     __builtin_add_overflow(last, step, &last);
  }
  if (!empty && (overflow || last >= static_cast<std::uint64_t>(storage->numel)))
    bad(fmt::format("tensor reaches past the end of storage '{}' ({} elements)", storage->s, storage->numel));
  // Broadcast views (stride 0) could name more elements than the storage holds; dlm reads dense tensors.
  std::uint64_t count = 1;
  bool too_many = false;
  for (std::int64_t n : t->shape) too_many |= __builtin_mul_overflow(count, static_cast<std::uint64_t>(n), &count);
  if (too_many || count > static_cast<std::uint64_t>(storage->numel))
    bad(fmt::format("tensor has more elements than its storage '{}' ({})", storage->s, storage->numel));
  return t;
}

PickleValue* Machine::call(const PickleValue* callable, const PickleValue* args, const PickleValue* kwargs) {
  if (callable->kind != Kind::kGlobal) bad("pickle calls a value that is not a global");
  if (args->kind != Kind::kTuple) bad(fmt::format("pickle calls {} with arguments that are not a tuple", callable->s));
  const Known& k = known_globals().at(callable->s);
  const auto& a = args->items;
  switch (k.role) {
    case Role::kDict: {
      PickleValue* d = make(Kind::kDict);
      if (!a.empty()) {
        if (a[0]->kind != Kind::kList && a[0]->kind != Kind::kTuple) bad("OrderedDict built from something other than pairs");
        for (const PickleValue* pair : a[0]->items) {
          if (pair->kind != Kind::kTuple || pair->items.size() != 2) bad("OrderedDict built from something other than pairs");
          d->entries.emplace_back(pair->items[0], pair->items[1]);
        }
      }
      return d;
    }
    case Role::kNamespace: {
      PickleValue* d = make(Kind::kDict);
      if (kwargs) {
        if (kwargs->kind != Kind::kDict) bad("namespace keyword arguments are not a dict");
        d->entries = kwargs->entries;
      }
      return d;
    }
    case Role::kSet: {
      PickleValue* l = make(Kind::kList);
      if (!a.empty()) {
        if (a[0]->kind != Kind::kList && a[0]->kind != Kind::kTuple) bad("set built from something other than a list");
        l->items = a[0]->items;
      }
      return l;
    }
    case Role::kBytesFromLatin1: {
      if (a.size() != 2 || a[0]->kind != Kind::kString || a[1]->kind != Kind::kString || a[1]->s != "latin1")
        bad("_codecs.encode is called with something other than (str, 'latin1')");
      PickleValue* b = make(Kind::kBytes);
      const std::string& u = a[0]->s;  // UTF-8 of code points < 256
      for (std::size_t i = 0; i < u.size(); ++i) {
        const auto c = static_cast<unsigned char>(u[i]);
        if (c < 0x80) b->s += static_cast<char>(c);
        else if ((c == 0xC2 || c == 0xC3) && i + 1 < u.size()) b->s += static_cast<char>(((c & 0x03) << 6) | (static_cast<unsigned char>(u[++i]) & 0x3F));
        else bad("_codecs.encode is given a character outside latin1");
      }
      return b;
    }
    case Role::kSize: {
      if (a.size() != 1 || (a[0]->kind != Kind::kTuple && a[0]->kind != Kind::kList)) bad("torch.Size built from something other than a tuple");
      PickleValue* t = make(Kind::kTuple);
      t->items = a[0]->items;
      return t;
    }
    case Role::kRebuildTensor: return rebuild_tensor(args, true);
    case Role::kRebuildTensorV1: return rebuild_tensor(args, false);
    case Role::kRebuildParameter:
      if (a.empty() || a[0]->kind != Kind::kTensor) bad("parameter rebuilt from something other than a tensor");
      return const_cast<PickleValue*>(a[0]);
    case Role::kRebuildFromType: {
      // The attributes (a[3]) are not kept; only a tensor rebuild may be named as the function.
      if (a.size() != 4 || a[0]->kind != Kind::kGlobal || a[1]->kind != Kind::kGlobal || a[2]->kind != Kind::kTuple)
        bad("_rebuild_from_type_v2 is called with something other than (function, type, args, state)");
      const Role inner = known_globals().at(a[0]->s).role;
      if ((inner != Role::kRebuildTensor && inner != Role::kRebuildParameter) || known_globals().at(a[1]->s).role != Role::kConstant)
        bad(fmt::format("_rebuild_from_type_v2 names {} and {}, not a tensor rebuild and a tensor type", a[0]->s, a[1]->s));
      return call(a[0], a[2], nullptr);
    }
    case Role::kStorage:
    case Role::kConstant: bad(fmt::format("pickle calls {}, which is not callable here", callable->s));
    case Role::kObject: break;
  }
  PickleValue* o = make(Kind::kObject);
  o->s = callable->s;
  o->args = args;
  return o;
}

void Machine::build(PickleValue* obj, PickleValue* state) {
  if (obj->kind == Kind::kObject) {
    obj->state = state;
  } else if (obj->kind == Kind::kDict) {  // a namespace: its __dict__
    if (state->kind == Kind::kDict) obj->entries.insert(obj->entries.end(), state->entries.begin(), state->entries.end());
    else bad("namespace state is not a dict");
  } else if (obj->kind != Kind::kTensor) {  // a parameter's state (rebuild_parameter_with_state) is not kept
    bad("pickle BUILDs a value that is not an object");
  }
}

// torch's persistent ids: ('storage', storage class, key, location, numel).
void Machine::persistent(const PickleValue* pid) {
  const auto& a = pid->items;
  if (pid->kind != Kind::kTuple || a.size() != 5 || a[0]->kind != Kind::kString || a[0]->s != "storage")
    bad("persistent id is not ('storage', type, key, location, numel)");
  if (a[1]->kind != Kind::kGlobal || known_globals().at(a[1]->s).role != Role::kStorage) bad("persistent id names no storage type");
  if (a[2]->kind != Kind::kString || a[4]->kind != Kind::kInt || a[4]->i < 0) bad("persistent id has a bad key or size");
  PickleValue* s = make(Kind::kStorage);
  s->dtype = known_globals().at(a[1]->s).dtype;
  s->s = a[2]->s;
  s->numel = a[4]->i;
  push(s);
}

const PickleValue* Machine::run() {
  for (;;) {
    op_at_ = at_;
    const std::uint8_t op = *take(1);
    switch (op) {
      case 0x80: take(1); break;                                     // PROTO
      case 0x95: take(8); break;                                     // FRAME (frames are transparent)
      case '.': {                                                    // STOP
        if (stack_.size() != 1 || !marks_.empty()) bad("pickle stops with other than one value on its stack");
        return stack_.back();
      }
      case '(': marks_.push_back(stack_.size()); break;              // MARK
      case '0': pop(); break;                                        // POP
      case '1': pop_to_mark(); break;                                // POP_MARK
      case '2': push(top()); break;                                  // DUP
      case 'N': push(make(Kind::kNone)); break;
      case 0x88: case 0x89: push(make(Kind::kBool))->b = op == 0x88; break;  // NEWTRUE / NEWFALSE
      case 'J': push(integer(static_cast<std::int32_t>(le(4)))); break;      // BININT
      case 'K': push(integer(static_cast<std::int64_t>(le(1)))); break;      // BININT1
      case 'M': push(integer(static_cast<std::int64_t>(le(2)))); break;      // BININT2
      case 0x8a: push(long_int(le(1))); break;                               // LONG1
      case 0x8b: push(long_int(le(4))); break;                               // LONG4
      case 'G': {                                                            // BINFLOAT (big-endian)
        const std::uint8_t* p = take(8);
        std::uint64_t u = 0;
        for (int k = 0; k < 8; ++k) u = (u << 8) | p[k];
        double d;
        std::memcpy(&d, &u, 8);
        push(make(Kind::kFloat))->f = d;
        break;
      }
      case 0x8c: push(string_value(Kind::kString, le(1))); break;  // SHORT_BINUNICODE
      case 'X': push(string_value(Kind::kString, le(4))); break;   // BINUNICODE
      case 0x8d: push(string_value(Kind::kString, le(8))); break;  // BINUNICODE8
      case 'U': push(string_value(Kind::kBytes, le(1))); break;    // SHORT_BINSTRING
      case 'T': push(string_value(Kind::kBytes, le(4))); break;    // BINSTRING
      case 'C': push(string_value(Kind::kBytes, le(1))); break;    // SHORT_BINBYTES
      case 'B': push(string_value(Kind::kBytes, le(4))); break;    // BINBYTES
      case 0x8e: case 0x96: push(string_value(Kind::kBytes, le(8))); break;  // BINBYTES8, BYTEARRAY8
      case ']': push(make(Kind::kList)); break;
      case '}': push(make(Kind::kDict)); break;
      case ')': push(make(Kind::kTuple)); break;
      case 0x8f: push(make(Kind::kList)); break;                   // EMPTY_SET (sets are lists here)
      case 't': push(tuple(pop_to_mark())); break;
      case 0x85: { PickleValue* a = pop(); push(tuple({a})); break; }
      case 0x86: { PickleValue* b = pop(); PickleValue* a = pop(); push(tuple({a, b})); break; }
      case 0x87: { PickleValue* c = pop(); PickleValue* b = pop(); PickleValue* a = pop(); push(tuple({a, b, c})); break; }
      case 'l': { PickleValue* l = make(Kind::kList); auto items = pop_to_mark(); l->items.assign(items.begin(), items.end()); push(l); break; }
      case 0x91: { PickleValue* l = make(Kind::kList); auto items = pop_to_mark(); l->items.assign(items.begin(), items.end()); push(l); break; }  // FROZENSET
      case 'd': { PickleValue* d = make(Kind::kDict); set_items(d, pop_to_mark()); push(d); break; }
      case 'a': { PickleValue* v = pop(); append(top(), {v}); break; }
      case 'e': { auto items = pop_to_mark(); append(top(), items); break; }
      case 0x90: { auto items = pop_to_mark(); append(top(), items); break; }  // ADDITEMS
      case 's': { PickleValue* v = pop(); PickleValue* k = pop(); set_items(top(), {k, v}); break; }
      case 'u': { auto kv = pop_to_mark(); set_items(top(), kv); break; }
      case 'q': memo_put(le(1)); break;                                         // BINPUT
      case 'r': memo_put(le(4)); break;                                         // LONG_BINPUT
      case 0x94: memo_put(memo_.size()); break;                                 // MEMOIZE
      case 'h': memo_get(le(1)); break;                                         // BINGET
      case 'j': memo_get(le(4)); break;                                         // LONG_BINGET
      case 'c': { std::string module = line(); std::string name = line(); global(module, name); break; }  // GLOBAL
      case 'i': {  // INST (protocol 0): the name is refused first when unknown
        std::string module = line();
        std::string name = line();
        global(module, name);
        bad("pickle opcode INST (protocol 0) is not one dlm reads");
      }
      case 0x93: {                                                              // STACK_GLOBAL
        PickleValue* name = pop();
        PickleValue* module = pop();
        if (name->kind != Kind::kString || module->kind != Kind::kString) bad("STACK_GLOBAL of values that are not strings");
        global(module->s, name->s);
        break;
      }
      case 'R': { PickleValue* args = pop(); PickleValue* f = pop(); push(call(f, args, nullptr)); break; }   // REDUCE
      case 0x81: { PickleValue* args = pop(); PickleValue* c = pop(); push(call(c, args, nullptr)); break; }  // NEWOBJ
      case 0x92: {                                                                                      // NEWOBJ_EX
        PickleValue* kwargs = pop();
        PickleValue* args = pop();
        PickleValue* c = pop();
        push(call(c, args, kwargs));
        break;
      }
      case 'b': { PickleValue* state = pop(); build(top(), state); break; }     // BUILD
      case 'Q': persistent(pop()); break;                                       // BINPERSID
      default:
        bad(fmt::format("pickle opcode 0x{:02x} is not one dlm reads (protocol 2-5 data opcodes only)", op));
    }
  }
}

}  // namespace

Pickle unpickle(std::span<const std::uint8_t> bytes, const std::string& file) {
  Pickle p;
  Machine m(bytes, file, p);
  p.root_ = m.run();
  return p;
}

}  // namespace dlm::ckpt
