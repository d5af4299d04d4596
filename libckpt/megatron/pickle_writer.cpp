// PickleWriter (torch_writer.h): protocol 2 opcodes, as Python's pickle module encodes them
// (Lib/pickletools.py names each).
#include <bit>
#include <cstring>

#include "dlm/ckpt/torch_writer.h"

namespace dlm::ckpt {

namespace {

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int k = 0; k < bytes; ++k) out.push_back(static_cast<char>((v >> (8 * k)) & 0xFF));
}

}  // namespace

PickleWriter::PickleWriter() { out_ = "\x80\x02"; }

PickleWriter& PickleWriter::none() { return out_.push_back('N'), *this; }
PickleWriter& PickleWriter::boolean(bool b) { return out_.push_back(b ? '\x88' : '\x89'), *this; }

PickleWriter& PickleWriter::integer(std::int64_t i) {
  if (i >= 0 && i < 256) {
    out_.push_back('K');
    put_le(out_, static_cast<std::uint64_t>(i), 1);
  } else if (i >= 0 && i < 65536) {
    out_.push_back('M');
    put_le(out_, static_cast<std::uint64_t>(i), 2);
  } else if (i >= INT32_MIN && i <= INT32_MAX) {
    out_.push_back('J');
    put_le(out_, static_cast<std::uint64_t>(i), 4);
  } else {
    // LONG1: the fewest little-endian two's-complement bytes that keep the sign.
    int n = 8;
    while (n > 1) {
      const std::int64_t top = i >> (8 * (n - 1) - 1);  // the dropped byte and the next sign bit
      if (top != 0 && top != -1) break;
      --n;
    }
    out_ += "\x8a";
    out_.push_back(static_cast<char>(n));
    put_le(out_, static_cast<std::uint64_t>(i), n);
  }
  return *this;
}

PickleWriter& PickleWriter::real(double f) {
  out_.push_back('G');
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(f);
  for (int k = 7; k >= 0; --k) out_.push_back(static_cast<char>((bits >> (8 * k)) & 0xFF));  // big-endian
  return *this;
}

PickleWriter& PickleWriter::string(std::string_view s) {
  out_.push_back('X');
  put_le(out_, s.size(), 4);
  out_ += s;
  return *this;
}

PickleWriter& PickleWriter::global(std::string_view module, std::string_view name) {
  out_.push_back('c');
  out_ += module;
  out_.push_back('\n');
  out_ += name;
  out_.push_back('\n');
  return *this;
}

PickleWriter& PickleWriter::mark() { return out_.push_back('('), *this; }
PickleWriter& PickleWriter::tuple() { return out_.push_back('t'), *this; }
PickleWriter& PickleWriter::empty_tuple() { return out_.push_back(')'), *this; }
PickleWriter& PickleWriter::empty_list() { return out_.push_back(']'), *this; }
PickleWriter& PickleWriter::appends() { return out_.push_back('e'), *this; }
PickleWriter& PickleWriter::empty_dict() { return out_.push_back('}'), *this; }
PickleWriter& PickleWriter::setitems() { return out_.push_back('u'), *this; }
PickleWriter& PickleWriter::reduce() { return out_.push_back('R'), *this; }
PickleWriter& PickleWriter::newobj() { return out_.push_back('\x81'), *this; }
PickleWriter& PickleWriter::build() { return out_.push_back('b'), *this; }
PickleWriter& PickleWriter::persistent_id() { return out_.push_back('Q'), *this; }

PickleWriter& PickleWriter::int_tuple(std::span<const std::int64_t> values) {
  if (values.empty()) return empty_tuple();
  if (values.size() > 3) mark();
  for (std::int64_t v : values) integer(v);
  static constexpr char kTupleN[] = {'\x85', '\x86', '\x87'};
  out_.push_back(values.size() > 3 ? 't' : kTupleN[values.size() - 1]);
  return *this;
}

std::string PickleWriter::finish() {
  out_.push_back('.');
  return std::move(out_);
}

void pickle_float_tensor(PickleWriter& w, std::string_view key, std::span<const std::int64_t> shape) {
  std::vector<std::int64_t> stride(shape.size(), 1);
  std::int64_t numel = 1;
  for (std::size_t d = shape.size(); d-- > 0;) stride[d] = numel, numel *= shape[d];
  w.global("torch._utils", "_rebuild_tensor_v2").mark();
  w.mark().string("storage").global("torch", "FloatStorage").string(key).string("cpu").integer(numel).tuple().persistent_id();
  w.integer(0).int_tuple(shape).int_tuple(stride).boolean(false);
  w.global("collections", "OrderedDict").empty_tuple().reduce();
  w.tuple().reduce();
}

}  // namespace dlm::ckpt
