// write_torch_archive (torch_writer.h): the zip layout of caffe2's PyTorchStreamWriter (APPNOTE.TXT
// 4.3.7 local header, 4.3.9 data descriptor, 4.3.12 central header, 4.3.14-4.3.16 end records, 4.5.3
// ZIP64 extra field).
#include <fmt/format.h>

#include "crc32.h"
#include "dlm/ckpt/torch_writer.h"
#include "hash.h"

namespace dlm::ckpt {

namespace {

constexpr std::uint64_t kAlignment = 64;
constexpr std::uint64_t kMax32 = 0xFFFFFFFFu;

class ZipOut {
 public:
  explicit ZipOut(const std::function<void(std::span<const std::uint8_t>)>& sink) : sink_(sink) {}
  std::uint64_t at() const { return at_ + buf_.size(); }
  void u16(std::uint64_t v) { le(v, 2); }
  void u32(std::uint64_t v) { le(v, 4); }
  void u64(std::uint64_t v) { le(v, 8); }
  void text(std::string_view s) { buf_.insert(buf_.end(), s.begin(), s.end()); }
  void bytes(std::span<const std::uint8_t> b) {
    flush();
    sink_(b);
    at_ += b.size();
  }
  void flush() {
    if (buf_.empty()) return;
    sink_(buf_);
    at_ += buf_.size();
    buf_.clear();
  }

 private:
  void le(std::uint64_t v, int n) {
    for (int k = 0; k < n; ++k) buf_.push_back(static_cast<std::uint8_t>((v >> (8 * k)) & 0xFF));
  }
  const std::function<void(std::span<const std::uint8_t>)>& sink_;
  std::vector<std::uint8_t> buf_;
  std::uint64_t at_ = 0;
};

struct Written {
  std::string name;
  std::uint64_t offset = 0, size = 0;
  std::uint32_t crc = 0;
};

void write_entry(ZipOut& z, std::string name, std::span<const std::uint8_t> data, std::vector<Written>& done) {
  const std::uint64_t offset = z.at(), size = data.size();
  const bool big = size >= kMax32;
  // Data 64-byte aligned: an "FB" extra field of 'Z's after the header, name and any ZIP64 field.
  const std::uint64_t start = offset + 30 + name.size() + 4 + (big ? 20 : 0);
  const std::uint64_t pad = (kAlignment - start % kAlignment) % kAlignment;
  z.u32(0x04034b50);
  z.u16(0), z.u16(0x0808), z.u16(0), z.u16(0), z.u16(0);  // version, flags (descriptor, UTF-8), stored, time, date
  z.u32(0), z.u32(big ? kMax32 : 0), z.u32(big ? kMax32 : 0);  // CRC and sizes follow in the descriptor
  z.u16(name.size()), z.u16(4 + pad + (big ? 20 : 0));
  z.text(name);
  if (big) z.u16(0x0001), z.u16(16), z.u64(size), z.u64(size);
  z.text("FB"), z.u16(pad), z.text(std::string(pad, 'Z'));
  const std::uint32_t crc = detail::crc32(data);
  z.bytes(data);
  z.u32(0x08074b50), z.u32(crc);
  if (big) z.u64(size), z.u64(size);
  else z.u32(size), z.u32(size);
  done.push_back({std::move(name), offset, size, crc});
}

void write_central(ZipOut& z, const std::vector<Written>& entries) {
  const std::uint64_t cd_start = z.at();
  for (const Written& e : entries) {
    const bool big_size = e.size >= kMax32, big_offset = e.offset >= kMax32;
    const std::uint16_t extra = (big_size ? 16 : 0) + (big_offset ? 8 : 0);
    z.u32(0x02014b50);
    z.u16(0), z.u16(0), z.u16(0x0808), z.u16(0), z.u16(0), z.u16(0);
    z.u32(e.crc), z.u32(big_size ? kMax32 : e.size), z.u32(big_size ? kMax32 : e.size);
    z.u16(e.name.size()), z.u16(extra ? 4 + extra : 0), z.u16(0), z.u16(0), z.u16(0), z.u32(0);
    z.u32(big_offset ? kMax32 : e.offset);
    z.text(e.name);
    if (extra) {
      z.u16(0x0001), z.u16(extra);
      if (big_size) z.u64(e.size), z.u64(e.size);
      if (big_offset) z.u64(e.offset);
    }
  }
  const std::uint64_t cd_size = z.at() - cd_start, zip64_end = z.at();
  z.u32(0x06064b50), z.u64(44), z.u16(0x031e), z.u16(0x2d), z.u32(0), z.u32(0);
  z.u64(entries.size()), z.u64(entries.size()), z.u64(cd_size), z.u64(cd_start);
  z.u32(0x07064b50), z.u32(0), z.u64(zip64_end), z.u32(1);
  const std::uint64_t n = std::min<std::uint64_t>(entries.size(), 0xFFFF);
  z.u32(0x06054b50), z.u16(0), z.u16(0), z.u16(n), z.u16(n);
  z.u32(std::min(cd_size, kMax32)), z.u32(std::min(cd_start, kMax32)), z.u16(0);
  z.flush();
}

std::span<const std::uint8_t> as_bytes(std::string_view s) { return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()}; }

}  // namespace

std::uint64_t write_torch_archive(std::string_view data_pkl, std::span<const TorchStorage> storages,
                                  const std::function<void(std::span<const std::uint8_t>)>& sink, std::string_view archive) {
  ZipOut z(sink);
  std::vector<Written> entries;
  const std::string dir = fmt::format("{}/", archive);
  write_entry(z, dir + "data.pkl", as_bytes(data_pkl), entries);
  write_entry(z, dir + ".format_version", as_bytes("1"), entries);
  write_entry(z, dir + ".storage_alignment", as_bytes("64"), entries);
  write_entry(z, dir + "byteorder", as_bytes("little"), entries);
  std::uint64_t id = detail::xxh64(data_pkl.data(), data_pkl.size());
  for (const TorchStorage& s : storages) {
    write_entry(z, dir + "data/" + s.key, s.bytes, entries);
    id = detail::xxh64(s.bytes.data(), s.bytes.size(), id);
  }
  write_entry(z, dir + "version", as_bytes("3\n"), entries);
  // torch's id only tells archives apart; here it is a digest of the pickle and the storages.
  const std::string serial = fmt::format("{:020}{:020}", id, detail::xxh64(&id, sizeof id));
  write_entry(z, dir + ".data/serialization_id", as_bytes(serial), entries);
  write_central(z, entries);
  return z.at();
}

}  // namespace dlm::ckpt
