// torch.save's zip files (torch_file.h): the central directory (APPNOTE.TXT 4.3.12-4.3.16, ZIP64
// 4.3.14-4.3.15, 4.5.3), stored entries only, and tensors copied out of their storages.
#include "dlm/ckpt/torch_file.h"

#include <array>
#include <cstring>

#include <fmt/format.h>

#include "crc32.h"
#include "dlm/common/error.h"

namespace dlm::ckpt {
namespace {

std::uint64_t le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int k = 0; k < n; ++k) v |= std::uint64_t{p[k]} << (8 * k);
  return v;
}

}  // namespace

StoredZip::StoredZip(std::span<const std::uint8_t> bytes, std::string name) : bytes_(bytes), name_(std::move(name)) {
  const std::string& path = name_;
  const std::uint8_t* d = bytes_.data();
  const std::uint64_t n = bytes_.size();
  auto bad = [&](std::uint64_t at, const std::string& what) -> void { fail_at_offset(path, at, what); };
  // End of central directory: the last "PK\5\6" within 22 + 65535 bytes of the end.
  std::uint64_t eocd = n;
  if (n >= 22)
    for (std::uint64_t at = n - 22, stop = n - 22 > 65535 ? n - 22 - 65535 : 0;; --at) {
      if (le(d + at, 4) == 0x06054b50) {
        eocd = at;
        break;
      }
      if (at == stop) break;
    }
  if (eocd == n) bad(n, "not a zip archive (no end-of-central-directory record); torch.save files are zip archives");
  std::uint64_t count = le(d + eocd + 10, 2), cd_size = le(d + eocd + 12, 4), cd_at = le(d + eocd + 16, 4);
  if (eocd >= 20 && le(d + eocd - 20, 4) == 0x07064b50) {  // ZIP64 locator -> ZIP64 end record
    const std::uint64_t z = le(d + eocd - 20 + 8, 8);
    if (z > n || n - z < 56 || le(d + z, 4) != 0x06064b50) bad(eocd - 20, "ZIP64 locator points at no ZIP64 end record");
    count = le(d + z + 32, 8);
    cd_size = le(d + z + 40, 8);
    cd_at = le(d + z + 48, 8);
  }
  if (cd_at > n || cd_size > n - cd_at) bad(eocd, "central directory lies outside the file");
  std::uint64_t at = cd_at;
  const std::uint64_t cd_end = cd_at + cd_size;
  for (std::uint64_t k = 0; k < count; ++k) {
    if (cd_end - at < 46 || le(d + at, 4) != 0x02014b50) bad(at, "central directory entry expected");
    const std::uint64_t method = le(d + at + 10, 2), name_len = le(d + at + 28, 2), extra_len = le(d + at + 30, 2),
                        comment_len = le(d + at + 32, 2);
    if (cd_end - at - 46 < name_len + extra_len + comment_len) bad(at, "central directory entry runs past the directory");
    Entry e;
    e.crc = static_cast<std::uint32_t>(le(d + at + 16, 4));
    std::uint64_t csize = le(d + at + 20, 4), usize = le(d + at + 24, 4), local = le(d + at + 42, 4);
    const std::string name(reinterpret_cast<const char*>(d + at + 46), name_len);
    // ZIP64 extra field: the 0xFFFFFFFF fields, in the order usize, csize, local offset.
    for (std::uint64_t x = at + 46 + name_len, xend = x + extra_len; xend - x >= 4;) {
      const std::uint64_t id = le(d + x, 2), len = le(d + x + 2, 2);
      if (xend - x - 4 < len) bad(x, "zip extra field runs past its entry");
      if (id == 0x0001) {
        std::uint64_t f = x + 4;
        for (std::uint64_t* field : {&usize, &csize, &local})
          if (*field == 0xFFFFFFFFu) {
            if (f + 8 > x + 4 + len) bad(x, "ZIP64 extra field too short");
            *field = le(d + f, 8);
            f += 8;
          }
      }
      x += 4 + len;
    }
    if (method != 0) bad(at, fmt::format("zip entry '{}' is compressed (method {}); dlm reads the stored entries torch.save writes", name, method));
    if (csize != usize) bad(at, fmt::format("zip entry '{}' is stored but its sizes differ", name));
    if (local > n || n - local < 30 || le(d + local, 4) != 0x04034b50) bad(local, fmt::format("zip entry '{}': local header expected", name));
    e.offset = local + 30 + le(d + local + 26, 2) + le(d + local + 28, 2);
    e.size = usize;
    if (e.offset > n || e.size > n - e.offset) bad(local, fmt::format("zip entry '{}' runs past the end of the file", name));
    entries_[name] = e;
    at += 46 + name_len + extra_len + comment_len;
  }
}

std::span<const std::uint8_t> StoredZip::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail_at(path(), fmt::format("zip entry '{}' is missing", name));
  const std::span<const std::uint8_t> bytes(bytes_.data() + it->second.offset, it->second.size);
  if (detail::crc32(bytes) != it->second.crc) fail_at_offset(path(), it->second.offset, fmt::format("zip entry '{}' fails its CRC-32 check (corrupted)", name));
  return bytes;
}

std::vector<std::string> StoredZip::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

TorchFile::TorchFile(const std::string& path) : file_(path), zip_(file_.bytes(), path) { open(); }

TorchFile::TorchFile(std::span<const std::uint8_t> bytes, const std::string& name) : zip_(bytes, name) { open(); }

void TorchFile::open() {
  const std::string& path = zip_.path();
  for (const std::string& name : zip_.names())
    if (name.ends_with("/data.pkl") && name.find('/') == name.size() - 9) prefix_ = name.substr(0, name.size() - 8);
  if (prefix_.empty()) fail_at(path, "zip archive has no <name>/data.pkl entry (not a torch.save file)");
  pickle_ = unpickle(zip_.entry(prefix_ + "data.pkl"), path + ":" + prefix_ + "data.pkl");
}

Tensor TorchFile::tensor(const PickleValue& t, std::string name) const {
  if (!t.is(PickleValue::Kind::kTensor)) fail_at(path(), fmt::format("'{}' is not a tensor", name));
  const std::string entry = prefix_ + "data/" + t.storage->s;
  return tensor_from_storage(t, zip_.entry(entry), path() + ":" + entry, std::move(name));
}

Tensor tensor_from_storage(const PickleValue& t, std::span<const std::uint8_t> storage, const std::string& where, std::string name) {
  const std::size_t es = torch_dtype_size(t.dtype);
  if (storage.size() < static_cast<std::uint64_t>(t.storage->numel) * es)
    fail_at(where, fmt::format("storage holds {} bytes, its tensors need {} elements of {}", storage.size(), t.storage->numel, torch_dtype_name(t.dtype)));
  TensorDType raw_dtype;
  switch (t.dtype) {
    case TorchDType::kFloat32: case TorchDType::kFloat64: raw_dtype = TensorDType::kFloat32; break;
    case TorchDType::kBFloat16: raw_dtype = TensorDType::kBFloat16; break;
    case TorchDType::kFloat16: raw_dtype = TensorDType::kFloat16; break;
    default: fail_at(where, fmt::format("tensor '{}' is {}; dlm reads floating-point weights only", name, torch_dtype_name(t.dtype)));
  }
  // Gathers the elements in row-major order of `shape` (strides may be anything, e.g. views of a buffer).
  const std::int64_t count = element_count(t.shape);
  std::vector<std::uint8_t> raw(static_cast<std::size_t>(count) * es);
  std::vector<std::int64_t> index(t.shape.size(), 0);
  for (std::int64_t k = 0; k < count; ++k) {
    std::int64_t src = t.storage_offset;
    for (std::size_t d = 0; d < index.size(); ++d) src += index[d] * t.stride[d];
    std::memcpy(raw.data() + k * es, storage.data() + src * es, es);
    for (std::size_t d = index.size(); d-- > 0;) {
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
  Tensor out;
  if (t.dtype == TorchDType::kFloat64) {
    out = Tensor::zeros(name, t.shape);
    for (std::int64_t k = 0; k < count; ++k) {
      double v;
      std::memcpy(&v, raw.data() + k * 8, 8);
      out.f32()[k] = static_cast<float>(v);
    }
    return out;
  }
  out = convert(TensorView{name, raw_dtype, t.shape, raw}, TensorDType::kFloat32);
  out.name = std::move(name);
  return out;
}

}  // namespace dlm::ckpt
