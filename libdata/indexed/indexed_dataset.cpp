#include "dlm/data/indexed_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <cstring>
#include <cstdint>
#include <type_traits>
#include <limits>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr std::uint64_t kVersion = 1;
constexpr std::size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Narrows int32 ids to the dataset's dtype, refusing ids it cannot hold.
template <typename T>
void narrow_into(std::span<const std::int32_t> tokens, std::vector<std::uint8_t>& out, const std::string& file) {
  out.resize(tokens.size() * sizeof(T));
  auto* dst = reinterpret_cast<T*>(out.data());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    std::int32_t id = tokens[i];
    if (id < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
        id > static_cast<std::int64_t>(std::numeric_limits<T>::max())) {
      fail_at(file, fmt::format("token id {} does not fit the dataset dtype", id));
    }
    dst[i] = static_cast<T>(id);
  }
}

// Calls f with a value of the C++ type that stores `dtype`'s elements (f's argument says the type, not a value).
template <typename F>
void with_element_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kUInt8: return f(std::uint8_t{});
    case DType::kInt8: return f(std::int8_t{});
    case DType::kInt16: return f(std::int16_t{});
    case DType::kUInt16: return f(std::uint16_t{});
    case DType::kInt32: return f(std::int32_t{});
    case DType::kInt64: return f(std::int64_t{});
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
  }
}

}  // namespace

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kUInt8: case DType::kInt8: return 1;
    case DType::kInt16: case DType::kUInt16: return 2;
    case DType::kInt32: case DType::kFloat32: return 4;
    case DType::kInt64: case DType::kFloat64: return 8;
  }
  fail("unknown dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat64: return "float64";
    case DType::kFloat32: return "float32";
    case DType::kUInt16: return "uint16";
  }
  return "?";
}

DType dtype_from_code(std::uint8_t code) {
  if (code < 1 || code > 8) fail(fmt::format("unknown dtype code {} (expected 1..8)", code));
  return static_cast<DType>(code);
}

DType optimal_token_dtype(std::optional<std::size_t> vocab_size) {
  return (vocab_size && *vocab_size < 65500) ? DType::kUInt16 : DType::kInt32;
}

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

void widen_tokens(DType dtype, const std::uint8_t* src, std::size_t count, std::int32_t* dst) {
  if (count == 0) return;  // empty sequences: dst may be null
  auto widen = [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < count; ++i) {
      const T v = load<T>(src + i * sizeof(T));
      // int64 and float files can hold values no int32 id has (casting a float beyond it is undefined
      // behaviour, found by the .idx/.bin fuzzer): refuse them rather than wrap.
      if constexpr (sizeof(T) > 4 || std::is_floating_point_v<T>) {
        if (!(v >= T(-2147483648.0) && v < T(2147483648.0)) || static_cast<T>(static_cast<std::int32_t>(v)) != v)
          fail(fmt::format("{} token {} (element {}) is not an int32 token id", dtype_name(dtype), static_cast<double>(v), i));
      }
      dst[i] = static_cast<std::int32_t>(v);
      // A negative id would index before the embedding table (or be clamped to 0 and trained silently).
      if constexpr (std::is_signed_v<T>) {
        if (v < 0) fail(fmt::format("{} token {} (element {}) is negative, expected ids >= 0", dtype_name(dtype),
                                    static_cast<double>(v), i));
      }
    }
  };
  with_element_type(dtype, widen);
}

// ---------------------------------------------------------------------------------------------- writer

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, DType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype), bin_(bin_path(prefix_), 4 << 20) {}

void IndexedDatasetWriter::add_item(std::span<const std::int32_t> tokens) {
  if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    fail_at(bin_path(prefix_), "sequence longer than 2^31-1 tokens (the .idx stores int32 lengths)");
  }
  const std::string& file = bin_.path();
  if (dtype_ == DType::kFloat32 || dtype_ == DType::kFloat64) {
    fail_at(file, fmt::format("cannot write tokens as {}", dtype_name(dtype_)));
  }
  if (dtype_ == DType::kInt32) bin_.write(tokens.data(), tokens.size_bytes());
  // Other dtypes are converted a chunk at a time: a document of 100M tokens needs no copy of itself.
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  for (std::size_t at = 0; dtype_ != DType::kInt32 && at < tokens.size(); at += kChunk) {
    const auto part = tokens.subspan(at, std::min(kChunk, tokens.size() - at));
    switch (dtype_) {
      case DType::kUInt16: narrow_into<std::uint16_t>(part, scratch_, file); break;
      case DType::kUInt8: narrow_into<std::uint8_t>(part, scratch_, file); break;
      case DType::kInt8: narrow_into<std::int8_t>(part, scratch_, file); break;
      case DType::kInt16: narrow_into<std::int16_t>(part, scratch_, file); break;
      case DType::kInt64: {
        scratch_.resize(part.size() * 8);
        for (std::size_t i = 0; i < part.size(); ++i) {
          std::int64_t v = part[i];
          std::memcpy(scratch_.data() + 8 * i, &v, 8);
        }
        break;
      }
      default: fail_at(file, fmt::format("cannot write tokens as {}", dtype_name(dtype_)));
    }
    bin_.write(scratch_.data(), scratch_.size());
  }
  lengths_.push_back(static_cast<std::int32_t>(tokens.size()));
  tokens_ += tokens.size();
}

void IndexedDatasetWriter::end_document() {
  document_indices_.push_back(static_cast<std::int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::add_document(std::span<const std::int32_t> tokens, std::span<const std::int32_t> lengths) {
  std::size_t at = 0;
  for (std::int32_t len : lengths) {
    if (len < 0 || at + static_cast<std::size_t>(len) > tokens.size()) {
      fail_at(bin_path(prefix_), "add_document: lengths do not add up to the tokens given");
    }
    add_item(tokens.subspan(at, static_cast<std::size_t>(len)));
    at += static_cast<std::size_t>(len);
  }
  if (at != tokens.size()) fail_at(bin_path(prefix_), "add_document: lengths do not add up to the tokens given");
  end_document();
}

void IndexedDatasetWriter::append(const std::string& other_prefix) {
  IndexedDataset other(other_prefix);
  other.validate();  // a merge never writes what validate would refuse
  if (other.dtype() != dtype_) {
    fail_at(idx_path(other_prefix), fmt::format("dtype {} differs from the output's {}", dtype_name(other.dtype()),
                                                dtype_name(dtype_)));
  }
  auto offset = static_cast<std::int64_t>(lengths_.size());
  const auto& lengths = other.sequence_lengths();
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    lengths_.push_back(lengths[i]);
    bytes += static_cast<std::uint64_t>(lengths[i]) * dtype_size(dtype_);
  }
  tokens_ += bytes / dtype_size(dtype_);
  const auto& docs = other.document_indices();
  for (std::size_t i = 1; i < docs.size(); ++i) document_indices_.push_back(offset + docs[i]);
  if (bytes > other.bin_bytes().size()) fail_at(bin_path(other_prefix), "shorter than its index says");
  if (bytes != 0) bin_.write(other.bin_bytes().data(), bytes);
}

void IndexedDatasetWriter::finalize() {
  if (finalized_) return;
  AtomicFile idx(idx_path(prefix_));
  idx.write(kMagic, sizeof kMagic);
  idx.write_pod(kVersion);
  idx.write_pod(static_cast<std::uint8_t>(dtype_));
  idx.write_pod(static_cast<std::uint64_t>(lengths_.size()));
  idx.write_pod(static_cast<std::uint64_t>(document_indices_.size()));
  idx.write_span(std::span<const std::int32_t>(lengths_));
  std::vector<std::int64_t> pointers(lengths_.size());
  std::int64_t at = 0;
  auto item = static_cast<std::int64_t>(dtype_size(dtype_));
  for (std::size_t i = 0; i < lengths_.size(); ++i) {
    pointers[i] = at;
    at += static_cast<std::int64_t>(lengths_[i]) * item;
  }
  idx.write_span(std::span<const std::int64_t>(pointers));
  idx.write_span(std::span<const std::int64_t>(document_indices_));
  // The old .idx goes first, then the .bin, then the new .idx: whenever the writer dies, the pair on disk
  // is the old one, no .idx (refused as missing), or the new one; never a new .bin under an old .idx.
  const std::string old_idx = idx_path(prefix_);
  if (::unlink(old_idx.c_str()) != 0 && errno != ENOENT) fail_errno(old_idx, "cannot remove the old index", errno);
  const auto folder = std::filesystem::path(old_idx).parent_path();
  fsync_directory(folder.empty() ? std::string(".") : folder.string());
  bin_.commit();
  idx.commit();
  finalized_ = true;
}

// ---------------------------------------------------------------------------------------------- reader

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix), idx_(idx_path(prefix)), bin_(bin_path(prefix)) {
  const std::string file = idx_path(prefix);
  const std::uint8_t* p = idx_.data();
  const std::size_t size = idx_.size();
  if (size < kHeaderBytes) {
    fail_at(file, fmt::format("truncated header: {} bytes, expected at least {}", size, kHeaderBytes));
  }
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0) fail_at_offset(file, 0, "bad magic, expected \"MMIDIDX\\0\\0\"");
  auto version = load<std::uint64_t>(p + 9);
  if (version != kVersion) fail_at_offset(file, 9, fmt::format("unsupported version {}, expected 1", version));
  std::uint8_t code = p[17];
  if (code < 1 || code > 8) fail_at_offset(file, 17, fmt::format("unknown dtype code {}, expected 1..8", code));
  dtype_ = static_cast<DType>(code);
  auto sequences = load<std::uint64_t>(p + 18);
  auto documents = load<std::uint64_t>(p + 26);
  // Overflow-safe size check before any view is made.
  const std::uint64_t left = size - kHeaderBytes;
  if (sequences > left / 12 || documents > (left - sequences * 12) / 8) {
    fail_at(file, fmt::format("truncated: {} sequences and {} documents need {} bytes after the header, file has {}",
                              sequences, documents, static_cast<long double>(sequences) * 12 + documents * 8.0L, left));
  }
  if (documents == 0) fail_at_offset(file, 26, "document count is 0, expected at least the leading 0 index");
  const std::uint8_t* at = p + kHeaderBytes;
  lengths_ = UnalignedArray<std::int32_t>(at, sequences);
  at += sequences * 4;
  pointers_ = UnalignedArray<std::int64_t>(at, sequences);
  at += sequences * 8;
  documents_ = UnalignedArray<std::int64_t>(at, documents);
  check_structure();
}

// Every reader (validate, inspect, dlm-blend, dlm-train) relies on these invariants, so they are checked
// when the dataset is opened, not only by validate(): a crafted pointer would otherwise be read as an
// offset before or past the mapped .bin.
void IndexedDataset::check_structure() const {
  const std::string file = idx_path(prefix_);
  const std::uint64_t item = dtype_size(dtype_);
  const std::uint64_t lengths_at = kHeaderBytes, pointers_at = lengths_at + 4 * lengths_.size();
  const std::uint64_t documents_at = pointers_at + 8 * pointers_.size();
  std::uint64_t expected = 0;
  for (std::size_t i = 0; i < lengths_.size(); ++i) {
    std::int32_t len = lengths_[i];
    std::int64_t ptr = pointers_[i];
    if (len < 0) fail_at_offset(file, lengths_at + 4 * i, fmt::format("sequence {} has negative length {}", i, len));
    if (ptr < 0 || static_cast<std::uint64_t>(ptr) != expected) {
      fail_at_offset(file, pointers_at + 8 * i,
                     fmt::format("sequence {} pointer {} is not the running sum of lengths ({})", i, ptr, expected));
    }
    expected += static_cast<std::uint64_t>(len) * item;
    if (expected > bin_.size()) {
      fail_at(bin_path(prefix_), fmt::format("shorter than the index says: sequence {} of {} ends at byte {}, the "
                                             "file has {} bytes", i, idx_path(prefix_), expected, bin_.size()));
    }
  }
  // The writer commits the .bin before the .idx, and removes the old .idx first: a .bin longer than its
  // index says is a stale pair (a .bin rewritten under an older .idx) or trailing garbage.
  if (expected != bin_.size()) {
    fail_at(bin_path(prefix_), fmt::format("{} bytes, but {} describes {} bytes of tokens (a stale or mismatched "
                                           ".bin/.idx pair, or trailing bytes)",
                                           bin_.size(), idx_path(prefix_), expected));
  }
  if (documents_[0] != 0) fail_at_offset(file, documents_at, "document indices must start with 0");
  for (std::size_t d = 1; d < documents_.size(); ++d) {
    std::int64_t v = documents_[d], prev = documents_[d - 1];
    if (v < prev || static_cast<std::uint64_t>(v) > lengths_.size()) {
      fail_at_offset(file, documents_at + 8 * d,
                     fmt::format("document index {} = {} is not monotone within [0, {}]", d, v, lengths_.size()));
    }
  }
  const std::uint64_t trailing = idx_.size() - (documents_at + 8 * documents_.size());
  // Megatron's multimodal datasets append one int8 mode per sequence; anything else is corruption.
  if (trailing != 0 && trailing != lengths_.size()) {
    fail_at_offset(file, documents_at + 8 * documents_.size(), fmt::format("{} unexpected trailing bytes", trailing));
  }
}

void IndexedDataset::validate() const {
  check_structure();
  const TokenRange range = token_range(*this);
  if (range.min < 0) {
    fail_at_offset(bin_path(prefix_), range.min_offset,
                   fmt::format("token id {} is negative, expected ids >= 0", range.min));
  }
}

TokenRange token_range(const IndexedDataset& dataset) {
  const auto bytes = dataset.bin_bytes();
  TokenRange range;
  auto scan = [&](auto zero) {
    using T = decltype(zero);
    const std::size_t n = bytes.size() / sizeof(T);
    for (std::size_t i = 0; i < n; ++i) {
      const T v = load<T>(bytes.data() + i * sizeof(T));
      if constexpr (std::is_floating_point_v<T>) {
        if (!(v >= T(-2147483648.0) && v < T(2147483648.0)) || static_cast<T>(static_cast<std::int32_t>(v)) != v)
          fail_at_offset(bin_path(dataset.prefix()), i * sizeof(T),
                         fmt::format("{} token {} is not an int32 token id", dtype_name(dataset.dtype()),
                                     static_cast<double>(v)));
      }
      const auto id = static_cast<std::int64_t>(v);
      if (i == 0 || id < range.min) range.min = id, range.min_offset = i * sizeof(T);
      if (i == 0 || id > range.max) range.max = id;
    }
  };
  with_element_type(dataset.dtype(), scan);
  return range;
}

std::span<const std::uint8_t> IndexedDataset::sequence_bytes(std::size_t i, std::size_t offset, std::size_t length) const {
  if (i >= lengths_.size()) {
    fail_at(idx_path(prefix_), fmt::format("sequence {} out of range ({} sequences)", i, lengths_.size()));
  }
  auto len = static_cast<std::size_t>(lengths_[i]);
  if (offset > len) fail_at(idx_path(prefix_), fmt::format("offset {} past sequence {} of {} tokens", offset, i, len));
  std::size_t count = (length == npos) ? len - offset : length;
  if (offset + count > len) {
    fail_at(idx_path(prefix_), fmt::format("slice [{}, {}) past sequence {} of {} tokens", offset, offset + count, i, len));
  }
  std::uint64_t begin = static_cast<std::uint64_t>(pointers_[i]) + offset * dtype_size(dtype_);
  std::uint64_t bytes = count * dtype_size(dtype_);
  if (begin + bytes > bin_.size()) {
    fail_at(bin_path(prefix_), fmt::format("sequence {} reaches byte {}, past the end ({} bytes)", i, begin + bytes,
                                           bin_.size()));
  }
  return {bin_.data() + begin, bytes};
}

void IndexedDataset::read_sequence(std::size_t i, std::vector<std::int32_t>& out, std::size_t offset,
                                   std::size_t length) const {
  if (length == npos) {
    if (i >= lengths_.size()) sequence_bytes(i);  // throws the range error
    length = static_cast<std::size_t>(lengths_[i]) - std::min<std::size_t>(offset, lengths_[i]);
  }
  auto bytes = sequence_bytes(i, offset, length);
  std::size_t at = out.size();
  out.resize(at + length);
  widen_tokens(dtype_, bytes.data(), length, out.data() + at);
}

std::vector<std::int32_t> IndexedDataset::sequence(std::size_t i, std::size_t offset, std::size_t length) const {
  std::vector<std::int32_t> out;
  read_sequence(i, out, offset, length);
  return out;
}

std::vector<std::int32_t> IndexedDataset::document(std::size_t d) const {
  if (d + 1 >= documents_.size()) {
    fail_at(idx_path(prefix_), fmt::format("document {} out of range ({} documents)", d, num_documents()));
  }
  std::vector<std::int32_t> out;
  for (auto s = documents_[d]; s < documents_[d + 1]; ++s) read_sequence(static_cast<std::size_t>(s), out);
  return out;
}

}  // namespace dlm::data
