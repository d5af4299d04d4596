// A file written by torch.save (the zip format, torch >= 1.6): a zip archive whose entries are
//   <name>/data.pkl        the pickled object; tensors refer to storages by persistent id
//   <name>/data/<key>      each storage's raw little-endian bytes
//   <name>/version, <name>/byteorder, <name>/.format_version, ...
// torch writes every entry stored (uncompressed, 64-byte aligned), so the archive is read through its
// central directory straight from the mapped file; a compressed entry is refused, and each entry's
// CRC-32 is checked when it is read. The pickle is read by the restricted unpickler (pickle.h).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "dlm/ckpt/pickle.h"
#include "dlm/ckpt/tensor.h"
#include "dlm/common/mapped_file.h"

namespace dlm::ckpt {

// The stored entries of a zip archive held in memory (a mapped file or a slice of one), by name
// (ZIP64 included). `name` names the archive in errors.
class StoredZip {
 public:
  StoredZip(std::span<const std::uint8_t> bytes, std::string name);
  // The entry's bytes (CRC-checked); throws dlm::Error naming the archive and entry when absent.
  std::span<const std::uint8_t> entry(const std::string& name) const;
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const std::string& path() const { return name_; }
  std::vector<std::string> names() const;

 private:
  struct Entry {
    std::uint64_t offset = 0, size = 0;
    std::uint32_t crc = 0;
  };
  std::span<const std::uint8_t> bytes_;
  std::string name_;
  std::map<std::string, Entry> entries_;
};

class TorchFile {
 public:
  explicit TorchFile(const std::string& path);
  // An archive inside other bytes (a torch.distributed.checkpoint .distcp item); `bytes` must outlive it.
  TorchFile(std::span<const std::uint8_t> bytes, const std::string& name);
  const PickleValue& root() const { return pickle_.root(); }
  const std::string& path() const { return zip_.path(); }
  // A kTensor value of this file's pickle, copied out as a contiguous fp32 tensor (floating dtypes only).
  Tensor tensor(const PickleValue& t, std::string name = "") const;

 private:
  void open();
  MappedFile file_;
  StoredZip zip_;
  std::string prefix_;  // "<name>/"
  Pickle pickle_;
};

// A kTensor copied out of its storage's raw bytes as a contiguous fp32 tensor (any strides and offset;
// fp32, fp64, bf16 and fp16 storages). `where` names the storage in errors.
Tensor tensor_from_storage(const PickleValue& t, std::span<const std::uint8_t> storage, const std::string& where, std::string name);

}  // namespace dlm::ckpt
