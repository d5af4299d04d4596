// safetensors files: read through a memory map (zero-copy views), write atomically; multi-file
// checkpoints with model.safetensors.index.json.
//
// Layout: u64 little-endian N, then N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [b, e]},
// "__metadata__": {str: str}}, then the data. Offsets are relative to the end of the header, tensors
// must tile the data exactly (no gaps, no overlap, nothing past the end) and e - b must equal
// numel * dtype size. Every violation is a dlm::Error naming the file, the byte offset (header) or the
// tensor, and what was expected. The writer pads the header with spaces to a multiple of 8 so that
// every tensor is 8-byte aligned in the file (and so in the mapping).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlm/ckpt/tensor.h"
#include "dlm/common/mapped_file.h"

namespace dlm::ckpt {

using SafetensorsMetadata = std::map<std::string, std::string>;

// The parsed header of a safetensors image; views point into `bytes`. `file` names it in errors.
struct SafetensorsHeader {
  std::vector<TensorView> tensors;  // in file order
  SafetensorsMetadata metadata;
};
SafetensorsHeader parse_safetensors(std::span<const std::uint8_t> bytes, const std::string& file);

class SafetensorsFile {
 public:
  // Maps and validates the whole header; the data is not touched until a view is read.
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return mapping_.path(); }
  const std::vector<TensorView>& tensors() const { return header_.tensors; }
  const SafetensorsMetadata& metadata() const { return header_.metadata; }
  // nullptr when absent.
  const TensorView* find(std::string_view name) const;

 private:
  MappedFile mapping_;
  SafetensorsHeader header_;
};

// Writes one file atomically (temp + fsync + rename). Names must be unique and non-empty.
void write_safetensors(const std::string& path, std::span<const TensorView> tensors,
                       const SafetensorsMetadata& metadata = {});

// A folder of one model.safetensors or of the shards listed by model.safetensors.index.json.
class SafetensorsFolder {
 public:
  explicit SafetensorsFolder(const std::string& dir);
  // Every tensor of every file, sorted by name; a name in two files is an error.
  const std::vector<const TensorView*>& tensors() const { return all_; }
  const TensorView* find(std::string_view name) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<const TensorView*> all_;
};

// Writes `tensors` into `dir` as model.safetensors, or, beyond max_shard_bytes, as
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json (transformers' naming).
// Returns the files written.
std::vector<std::string> write_safetensors_folder(const std::string& dir, std::span<const TensorView> tensors,
                                                  std::uint64_t max_shard_bytes = 5ull << 30,
                                                  const SafetensorsMetadata& metadata = {{"format", "pt"}});

}  // namespace dlm::ckpt
