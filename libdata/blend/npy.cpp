// .npy reading and writing (format version 1.0, integer arrays only).
#include "dlm/data/npy.h"

#include <string_view>

#include <fmt/format.h>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"

namespace dlm::data {

namespace {
constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kAlign = 64;  // numpy's ARRAY_ALIGN: data starts at a multiple of 64

struct TypeInfo { NpyType type; const char* descr; std::size_t size; };
constexpr TypeInfo kTypes[] = {
    {NpyType::kInt8, "|i1", 1},  {NpyType::kInt16, "<i2", 2},  {NpyType::kInt32, "<i4", 4},
    {NpyType::kInt64, "<i8", 8}, {NpyType::kUInt8, "|u1", 1},  {NpyType::kUInt16, "<u2", 2},
    {NpyType::kUInt32, "<u4", 4}, {NpyType::kUInt64, "<u8", 8},
};

const TypeInfo& info(NpyType type) {
  for (const auto& t : kTypes)
    if (t.type == type) return t;
  fail("npy: unknown type");
}

// A header field as an error message shows it: bytes outside printable ASCII as \xNN (a damaged
// header must not break the message's one line), at most 48 of them.
std::string shown(std::string_view field) {
  std::string out;
  for (std::size_t i = 0; i < field.size() && i < 48; ++i) {
    const auto c = static_cast<unsigned char>(field[i]);
    if (c < 0x20 || c >= 0x7f) out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  if (field.size() > 48) out += "...";
  return out;
}

// The value following "'key':" in a numpy header dict, up to the next top-level ',' or '}'.
std::string_view header_value(const std::string& path, std::string_view header, std::string_view key) {
  const std::string quoted = "'" + std::string(key) + "':";
  const auto at = header.find(quoted);
  if (at == std::string_view::npos) fail_at_offset(path, 10, "npy header has no '" + std::string(key) + "'");
  std::size_t begin = at + quoted.size();
  while (begin < header.size() && header[begin] == ' ') ++begin;
  std::size_t end = begin;
  int depth = 0;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    else if (c == ')') --depth;
    else if ((c == ',' || c == '}') && depth == 0) break;
  }
  return header.substr(begin, end - begin);
}
}  // namespace

std::size_t npy_type_size(NpyType type) { return info(type).size; }
const char* npy_type_descr(NpyType type) { return info(type).descr; }

std::size_t NpyArray::size() const noexcept {
  std::size_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

void NpyArray::check_type(NpyType expected) const {
  if (expected != type_)
    fail("npy array" + (mapped_.path().empty() ? std::string() : " " + mapped_.path()) + " holds " +
         npy_type_descr(type_) + ", expected " + npy_type_descr(expected));
}

std::string npy_header(NpyType type, std::span<const std::size_t> shape) {
  // numpy: "{'descr': ..., 'fortran_order': False, 'shape': repr(tuple), }", padded with spaces so
  // that magic(6) + version(2) + length(2) + header + '\n' is a multiple of 64.
  std::string dims;
  if (shape.size() == 1) {
    dims = "(" + std::to_string(shape[0]) + ",)";
  } else {
    dims = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
    dims += ")";
  }
  std::string dict = std::string("{'descr': '") + npy_type_descr(type) + "', 'fortran_order': False, 'shape': " +
                     dims + ", }";
  const std::size_t unpadded = kMagic.size() + 4 + dict.size() + 1;
  dict.append((kAlign - unpadded % kAlign) % kAlign, ' ');
  dict += '\n';
  std::string out(kMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict;
}

void NpyArray::save(const std::string& path) const {
  AtomicFile file(path);
  file.write(npy_header(type_, shape_));
  file.write(data_, size_bytes());
  file.commit();
}

NpyArray NpyArray::load(const std::string& path) {
  NpyArray a;
  a.mapped_ = MappedFile(path);
  const auto bytes = a.mapped_.bytes();
  if (bytes.size() < 10 || std::string_view(reinterpret_cast<const char*>(bytes.data()), 6) != kMagic)
    fail_at_offset(path, 0, "not a .npy file (expected the \\x93NUMPY magic)");
  const std::uint8_t major = bytes[6];
  std::size_t header_len = 0, header_at = 0;
  if (major == 1) {
    header_len = bytes[8] | (std::size_t{bytes[9]} << 8);
    header_at = 10;
  } else if ((major == 2 || major == 3) && bytes.size() >= 12) {
    header_len = bytes[8] | (std::size_t{bytes[9]} << 8) | (std::size_t{bytes[10]} << 16) |
                 (std::size_t{bytes[11]} << 24);
    header_at = 12;
  } else {
    fail_at_offset(path, 6, "unsupported .npy version " + std::to_string(major));
  }
  if (header_at + header_len > bytes.size()) fail_at_offset(path, 8, "npy header runs past the end of the file");
  const std::string header(reinterpret_cast<const char*>(bytes.data()) + header_at, header_len);

  const auto descr = header_value(path, header, "descr");
  bool known = false;
  for (const auto& t : kTypes) {
    if (descr == "'" + std::string(t.descr) + "'" ||
        (t.size == 1 && descr == "'" + std::string(t.descr).replace(0, 1, "<") + "'")) {
      a.type_ = t.type;
      known = true;
    }
  }
  if (!known) fail_at_offset(path, header_at, "npy dtype " + shown(descr) + " is not a little-endian integer");
  if (header_value(path, header, "fortran_order") != "False")
    fail_at_offset(path, header_at, "npy array is in Fortran order, expected C order");
  const auto shape = header_value(path, header, "shape");
  a.shape_.clear();
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')')
    fail_at_offset(path, header_at, "npy shape " + shown(shape) + " is not a tuple");
  std::size_t value = 0;
  bool digits = false;
  for (std::size_t i = 1; i + 1 < shape.size(); ++i) {
    const char c = shape[i];
    if (c >= '0' && c <= '9') {
      if (value > (std::size_t{1} << 48))
        fail_at_offset(path, header_at, "npy shape " + shown(shape) + " has a dimension beyond 2^48");
      value = value * 10 + static_cast<std::size_t>(c - '0');
      digits = true;
    } else if (c == ',') {
      if (!digits) fail_at_offset(path, header_at, "npy shape " + shown(shape) + " is malformed");
      a.shape_.push_back(value);
      value = 0;
      digits = false;
    } else if (c != ' ' && c != 'L') {
      fail_at_offset(path, header_at, "npy shape " + shown(shape) + " is malformed");
    }
  }
  if (digits) a.shape_.push_back(value);
  if (a.shape_.empty()) a.shape_.push_back(1);  // a 0-d array holds one value

  const std::size_t data_at = header_at + header_len;
  // The element count and byte size must not wrap (a wrapped product could match a short file).
  std::size_t elements = 1;
  for (const std::size_t d : a.shape_) {
    if (d != 0 && elements > (std::size_t{1} << 56) / d)
      fail_at_offset(path, header_at, "npy shape " + shown(shape) + " has more elements than any file holds");
    elements *= d;
  }
  // Elements are read in place from the mapping (page-aligned): numpy pads its header so that the data
  // starts on a 64-byte boundary, and a file whose data is not aligned to its element size (found by the
  // .npy fuzzer: a misaligned int64 load) is not one numpy wrote.
  if (data_at % npy_type_size(a.type_) != 0)
    fail_at_offset(path, 8, "npy data starts at byte " + std::to_string(data_at) + ", not aligned to its " +
                                std::to_string(npy_type_size(a.type_)) + "-byte elements");
  const std::size_t expect = data_at + a.size_bytes();
  if (bytes.size() != expect)
    fail_at_offset(path, bytes.size() < expect ? bytes.size() : expect,
                   "npy data is " + std::to_string(bytes.size() - data_at) + " bytes, shape " + shown(shape) +
                       " needs " + std::to_string(a.size_bytes()) + " (truncated or corrupt)");
  a.data_ = bytes.data() + data_at;
  return a;
}

}  // namespace dlm::data
