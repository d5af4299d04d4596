#include "dlm/ckpt/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"

namespace dlm::ckpt {
namespace {

using nlohmann::json;
constexpr std::uint64_t kMaxHeader = 100ull << 20;  // the reference implementation's limit

std::int64_t checked_numel(const std::vector<std::int64_t>& shape, const std::string& file, const std::string& name) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) fail_at(file, fmt::format("tensor '{}': negative dimension {}", name, d));
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / 8 / d)
      fail_at(file, fmt::format("tensor '{}': shape overflows", name));
    n *= d;
  }
  return n;
}

// Returns the view (bytes not yet placed) and its data offset.
std::pair<TensorView, std::uint64_t> parse_entry(const std::string& name, const json& e, const std::string& file) {
  auto bad = [&](const std::string& what) { fail_at(file, fmt::format("header: tensor '{}': {}", name, what)); };
  if (!e.is_object()) bad("expected an object with dtype, shape, data_offsets");
  auto dt = e.find("dtype"), sh = e.find("shape"), off = e.find("data_offsets");
  if (dt == e.end() || !dt->is_string()) bad("missing string field 'dtype'");
  if (sh == e.end() || !sh->is_array()) bad("missing array field 'shape'");
  if (off == e.end() || !off->is_array() || off->size() != 2) bad("'data_offsets' must be an array [begin, end]");
  TensorView v;
  v.name = name;
  const std::string dtype = dt->get<std::string>();
  if (!parse_dtype(dtype, v.dtype) || dtype != dtype_name(v.dtype)) {
    static const char* known[] = {"F64", "I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL", "F8_E4M3", "F8_E5M2"};
    const bool other = std::find(std::begin(known), std::end(known), dtype) != std::end(known);
    bad(fmt::format("{} dtype '{}' (dlm reads F32, BF16, F16)", other ? "unsupported" : "unknown", dtype));
  }
  for (const json& d : *sh) {
    if (!d.is_number_integer()) bad("shape entries must be non-negative integers");
    v.shape.push_back(d.get<std::int64_t>());
  }
  for (const json& o : *off)
    if (!o.is_number_unsigned()) bad("data_offsets must be non-negative integers");
  const std::uint64_t b = (*off)[0].get<std::uint64_t>(), en = (*off)[1].get<std::uint64_t>();
  if (en < b) bad(fmt::format("data_offsets [{}, {}] end before they begin", b, en));
  const std::uint64_t want = static_cast<std::uint64_t>(checked_numel(v.shape, file, name)) * dtype_size(v.dtype);
  if (en - b != want) bad(fmt::format("data_offsets [{}, {}] hold {} bytes, shape and dtype need {}", b, en, en - b, want));
  return {std::move(v), b};
}

}  // namespace

SafetensorsHeader parse_safetensors(std::span<const std::uint8_t> bytes, const std::string& file) {
  if (bytes.size() < 8) fail_at_offset(file, 0, fmt::format("truncated: {} bytes, a safetensors file starts with an 8-byte header length", bytes.size()));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > bytes.size() - 8) fail_at_offset(file, 0, fmt::format("header length {} runs past the end of the file ({} bytes)", n, bytes.size()));
  if (n > kMaxHeader) fail_at_offset(file, 0, fmt::format("header length {} exceeds the {} byte limit", n, kMaxHeader));
  if (n == 0 || bytes[8] != '{') fail_at_offset(file, 8, "header must be a JSON object starting with '{'");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const json::parse_error& e) {
    fail_at_offset(file, 8 + (e.byte > 0 ? e.byte - 1 : 0), "header is not valid JSON");
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    fail_at_offset(file, 8, fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!header.is_object()) fail_at_offset(file, 8, "header must be a JSON object");
  SafetensorsHeader out;
  std::vector<std::uint64_t> begins;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) fail_at(file, "header: __metadata__ must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) fail_at(file, fmt::format("header: __metadata__ '{}' must be a string", m.key()));
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    if (it.key().empty()) fail_at(file, "header: empty tensor name");
    auto [view, begin] = parse_entry(it.key(), *it, file);
    out.tensors.push_back(std::move(view));
    begins.push_back(begin);
  }
  // The data must be tiled exactly: sorted by begin, each tensor starts where the previous ended.
  const std::uint8_t* data = bytes.data() + 8 + n;
  const std::uint64_t data_size = bytes.size() - 8 - n;
  std::vector<std::size_t> order(out.tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto begin_of = [&](std::size_t i) { return begins[i]; };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return begin_of(a) < begin_of(b); });
  std::uint64_t expect = 0;
  std::string previous;
  for (std::size_t i : order) {
    TensorView& v = out.tensors[i];
    const std::uint64_t b = begin_of(i), size = static_cast<std::uint64_t>(element_count(v.shape)) * dtype_size(v.dtype);
    if (b < expect) fail_at(file, fmt::format("header: tensor '{}' at data offset {} overlaps '{}' (ends at {})", v.name, b, previous, expect));
    if (b > expect) fail_at(file, fmt::format("header: gap in the data before tensor '{}' (offset {}, expected {})", v.name, b, expect));
    if (b + size > data_size) fail_at(file, fmt::format("header: tensor '{}' ends at data offset {}, past the end of the data ({} bytes)", v.name, b + size, data_size));
    v.bytes = {data + b, static_cast<std::size_t>(size)};
    expect = b + size;
    previous = v.name;
  }
  if (expect != data_size) fail_at_offset(file, 8 + n + expect, fmt::format("{} bytes after the last tensor", data_size - expect));
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : mapping_(path) {
  header_ = parse_safetensors(mapping_.bytes(), path);
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  for (const TensorView& v : header_.tensors)
    if (v.name == name) return &v;
  return nullptr;
}

void write_safetensors(const std::string& path, std::span<const TensorView> tensors, const SafetensorsMetadata& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const TensorView& v : tensors) {
    if (v.name.empty() || v.name == "__metadata__") fail_at(path, fmt::format("cannot write a tensor named '{}'", v.name));
    if (header.contains(v.name)) fail_at(path, fmt::format("tensor '{}' written twice", v.name));
    const std::uint64_t size = static_cast<std::uint64_t>(element_count(v.shape)) * dtype_size(v.dtype);
    if (size != v.bytes.size()) fail_at(path, fmt::format("tensor '{}': {} bytes for shape and dtype needing {}", v.name, v.bytes.size(), size));
    header[v.name] = {{"dtype", dtype_name(v.dtype)}, {"shape", v.shape}, {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  AtomicFile out(path, 8 << 20);
  const std::uint64_t n = text.size();
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(n >> (8 * i));
  out.write(len, 8);
  out.write(text);
  for (const TensorView& v : tensors) out.write(v.bytes.data(), v.bytes.size());
  out.commit();
}

SafetensorsFolder::SafetensorsFolder(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> names;
  if (fs::exists(index)) {
    json j;
    try {
      j = json::parse(read_text_file(index.string()));
    } catch (const json::parse_error& e) {
      fail_at_offset(index.string(), e.byte, "not valid JSON");
    } catch (const json::exception& e) {
      fail_at(index.string(), fmt::format("not valid JSON ({})", e.what()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail_at(index.string(), "expected an object with a 'weight_map' object");
    for (auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail_at(index.string(), fmt::format("weight_map['{}'] must be a file name", tensor));
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == "..") fail_at(index.string(), fmt::format("weight_map['{}']: '{}' is not a file in this folder", tensor, f));
      if (std::find(names.begin(), names.end(), f) == names.end()) names.push_back(f);
    }
    std::sort(names.begin(), names.end());
    for (const std::string& f : names)
      if (!fs::exists(fs::path(dir) / f)) fail_at(index.string(), fmt::format("shard file '{}' is missing", f));
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    names.push_back("model.safetensors");
  } else {
    fail_at(dir, "no model.safetensors or model.safetensors.index.json");
  }
  for (const std::string& f : names) files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / f).string()));
  for (const auto& f : files_)
    for (const TensorView& v : f->tensors()) all_.push_back(&v);
  std::sort(all_.begin(), all_.end(), [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  for (std::size_t i = 1; i < all_.size(); ++i)
    if (all_[i]->name == all_[i - 1]->name) fail_at(dir, fmt::format("tensor '{}' appears in two shard files", all_[i]->name));
}

const TensorView* SafetensorsFolder::find(std::string_view name) const {
  auto it = std::lower_bound(all_.begin(), all_.end(), name, [](const TensorView* v, std::string_view n) { return v->name < n; });
  return it != all_.end() && (*it)->name == name ? *it : nullptr;
}

std::vector<std::string> write_safetensors_folder(const std::string& dir, std::span<const TensorView> tensors,
                                                  std::uint64_t max_shard_bytes, const SafetensorsMetadata& metadata) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  std::vector<std::vector<TensorView>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (const TensorView& v : tensors) {
    if (!shards.back().empty() && in_shard + v.bytes.size() > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(v);
    in_shard += v.bytes.size();
    total += v.bytes.size();
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    written.push_back((fs::path(dir) / "model.safetensors").string());
    write_safetensors(written.back(), shards[0], metadata);
    fs::remove(fs::path(dir) / "model.safetensors.index.json");
    return written;
  }
  json weight_map = json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string name = fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, shards.size());
    written.push_back((fs::path(dir) / name).string());
    write_safetensors(written.back(), shards[i], metadata);
    for (const TensorView& v : shards[i]) weight_map[v.name] = name;
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomically((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  fs::remove(fs::path(dir) / "model.safetensors");
  return written;
}

}  // namespace dlm::ckpt
