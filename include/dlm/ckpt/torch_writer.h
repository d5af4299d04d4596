// Writing what Python's pickle and torch.load read: a pickle writer (protocol 2, the opcodes torch.save
// itself emits) and the torch.save zip archive around it.
//
// A torch.save archive, as torch 2.x writes it (caffe2/serialize/inline_container.cc):
//   <name>/data.pkl                 the pickle; a tensor is _rebuild_tensor_v2(storage, offset, size,
//                                   stride, requires_grad, OrderedDict()) with the storage as the
//                                   persistent id ('storage', torch.FloatStorage, key, 'cpu', numel)
//   <name>/.format_version "1", <name>/.storage_alignment "64", <name>/byteorder "little"
//   <name>/data/<key>               each storage's raw little-endian bytes
//   <name>/version "3\n", <name>/.data/serialization_id (40 digits)
// Every entry is stored (no compression) with a data descriptor, its data 64-byte aligned by an "FB"
// extra field of 'Z' padding; the archive ends with a ZIP64 end record, its locator and the classic end
// record, which torch writes always. Entries or offsets past 4 GiB carry ZIP64 extra fields.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dlm::ckpt {

// Appends pickle opcodes; the caller composes values in stack order (as pickle.Pickler would).
// Nothing is memoized, so a shared value is written once per use.
class PickleWriter {
 public:
  PickleWriter();  // PROTO 2
  PickleWriter& none();
  PickleWriter& boolean(bool b);
  PickleWriter& integer(std::int64_t i);
  PickleWriter& real(double f);
  PickleWriter& string(std::string_view s);
  PickleWriter& global(std::string_view module, std::string_view name);
  PickleWriter& mark();
  PickleWriter& tuple();  // the values since the last mark
  PickleWriter& empty_tuple();
  PickleWriter& empty_list();
  PickleWriter& appends();  // the values since the last mark onto the list below it
  PickleWriter& empty_dict();
  PickleWriter& setitems();  // key/value pairs since the last mark into the dict below it
  PickleWriter& reduce();    // callable, args tuple -> callable(*args)
  PickleWriter& newobj();    // class, args tuple -> cls.__new__(cls, *args)
  PickleWriter& build();     // object, state -> object with state (__setstate__ or __dict__.update)
  PickleWriter& persistent_id();  // the value on the stack is a persistent id
  // A tuple of integers (torch.Size's argument, a stride).
  PickleWriter& int_tuple(std::span<const std::int64_t> values);
  // Ends the pickle (STOP) and returns its bytes.
  std::string finish();

 private:
  std::string out_;
};

// One storage of an archive: data/<key> holds `bytes`, which must outlive the write.
struct TorchStorage {
  std::string key;
  std::span<const std::uint8_t> bytes;
};

// Writes a torch.save archive whose pickle is `data_pkl` to `sink` (called with consecutive pieces);
// returns its size. `archive` is the entries' folder name ("archive" for torch.save to a stream).
std::uint64_t write_torch_archive(std::string_view data_pkl, std::span<const TorchStorage> storages,
                                  const std::function<void(std::span<const std::uint8_t>)>& sink,
                                  std::string_view archive = "archive");

// The pickle of a contiguous fp32 tensor of `shape` whose storage is data/<key> (torch.save's form).
void pickle_float_tensor(PickleWriter& w, std::string_view key, std::span<const std::int64_t> shape);

}  // namespace dlm::ckpt
