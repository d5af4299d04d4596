// Cached index invariants and checksums (index_cache.h).
#include "index_cache.h"

#include <cstring>
#include <fmt/format.h>
#include <vector>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"

namespace dlm::data::detail {

namespace {

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull;

std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
std::uint64_t lane(std::uint64_t h, std::uint64_t w) { return rotl(h + w * kP2, 31) * kP1; }

std::string checksum_path(const std::string& base) { return base + "checksums.dlm"; }

using Defect = std::optional<std::pair<std::string, std::string>>;
Defect defect(const char* file, std::string what) { return std::make_pair(std::string(file), std::move(what)); }

}  // namespace

std::uint64_t checksum64(const std::uint8_t* p, std::size_t size) {
  std::uint64_t h[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  std::size_t i = 0;
  for (; i + 32 <= size; i += 32)
    for (int k = 0; k < 4; ++k) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      h[k] = lane(h[k], w);
    }
  std::uint64_t out = rotl(h[0], 1) + rotl(h[1], 7) + rotl(h[2], 12) + rotl(h[3], 18) + size;
  for (; i < size; ++i) out = rotl(out ^ (p[i] * kP3), 11) * kP1;
  out ^= out >> 33;
  out *= kP2;
  out ^= out >> 29;
  return out;
}

void write_checksums(const std::string& base, std::span<const NamedArray> arrays) {
  std::string text;
  for (const auto& [name, array] : arrays)
    text += fmt::format("{}.npy {:016x}\n", name, checksum64(array->data(), array->size_bytes()));
  write_file_atomically(checksum_path(base), text);
}

std::optional<std::pair<std::string, std::string>> checksum_defect(const std::string& base,
                                                                   std::span<const NamedArray> arrays) {
  const std::string path = checksum_path(base);
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const Error&) {
    return std::nullopt;  // none written (megatron-core's cache): the invariants alone decide
  }
  for (const auto& [name, array] : arrays) {
    const std::string file = std::string(name) + ".npy";
    const auto at = text.find(file + " ");
    if (at == std::string::npos) return std::make_pair(file, "no checksum for it in " + path);
    if (text.compare(at + file.size() + 1, 16, fmt::format("{:016x}", checksum64(array->data(), array->size_bytes()))) != 0)
      return std::make_pair(file, "its data differs from the checksum in " + path);
  }
  return std::nullopt;
}

std::optional<std::pair<std::string, std::string>> gpt_index_defect(const GptIndex& index, const GptIndexPlan& plan,
                                                                     UnalignedArray<std::int32_t> lengths,
                                                                     std::int64_t begin, std::int64_t end,
                                                                     const GptIndexConfig& config, bool drop_last) {
  const auto& di = index.document_index;
  const auto& si = index.sample_index;
  const auto& sh = index.shuffle_index;
  const auto docs = static_cast<std::size_t>(plan.documents);
  const auto samples = static_cast<std::size_t>(plan.samples);
  if (di.type() != NpyType::kInt32 || di.shape().size() != 1 || di.size() != docs)
    return defect("document_index.npy", fmt::format("expected int32[{}]", docs));
  const NpyType sample_type = plan.sample_index_int64 ? NpyType::kInt64 : NpyType::kInt32;
  if (si.type() != sample_type || si.shape().size() != 2 || si.shape()[0] != samples + 1 || si.shape()[1] != 2)
    return defect("sample_index.npy", fmt::format("expected {}[{}, 2]", npy_type_descr(sample_type), samples + 1));
  const NpyType shuffle_type = plan.shuffle_index_int64 ? NpyType::kInt64 : NpyType::kUInt32;
  if (sh.type() != shuffle_type || sh.shape().size() != 1 || sh.size() != samples)
    return defect("shuffle_index.npy", fmt::format("expected {}[{}]", npy_type_descr(shuffle_type), samples));

  // Every sequence of the split, plan.epochs times.
  std::vector<std::int64_t> seen(static_cast<std::size_t>(end - begin), 0);
  for (std::size_t i = 0; i < docs; ++i) {
    const std::int64_t d = di[i];
    if (d < begin || d >= end || ++seen[static_cast<std::size_t>(d - begin)] > plan.epochs)
      return defect("document_index.npy", fmt::format("entry {} ({}) is outside the split or repeats a sequence more "
                                                      "than {} times", i, d, plan.epochs));
  }

  // Rows exactly sequence_length tokens apart: walk the document index once, keeping the token
  // position where document p starts.
  const std::int64_t L = config.sequence_length;
  std::size_t p = 0;
  std::int64_t p_start = 0, previous = 0;
  for (std::size_t r = 0; r <= samples; ++r) {
    const std::int64_t doc = si[2 * r], offset = si[2 * r + 1];
    if (doc < static_cast<std::int64_t>(p) || static_cast<std::size_t>(doc) >= docs)
      return defect("sample_index.npy", fmt::format("row {} points at document {}, before the previous row's or past "
                                                    "the document index", r, doc));
    for (; p < static_cast<std::size_t>(doc); ++p) p_start += lengths[static_cast<std::size_t>(di[p])];
    if (offset < 0 || offset > lengths[static_cast<std::size_t>(di[p])])
      return defect("sample_index.npy", fmt::format("row {} starts at offset {} of a {}-token document", r, offset,
                                                    lengths[static_cast<std::size_t>(di[p])]));
    const std::int64_t position = p_start + offset;
    const std::int64_t step = position - previous;
    const bool partial_last = !drop_last && r == samples;
    if (r == 0 ? position != 0 : (partial_last ? step <= 0 || step > L : step != L))
      return defect("sample_index.npy", fmt::format("row {} is {} tokens after row {}, expected {}", r, step,
                                                    r == 0 ? 0 : r - 1, r == 0 ? 0 : L));
    previous = position;
  }

  // Two permutations: [0, first) then [first, samples).
  const auto first = static_cast<std::size_t>(plan.separate_final_epoch ? plan.samples_before_final : plan.samples);
  std::vector<bool> taken(samples, false);
  for (std::size_t i = 0; i < samples; ++i) {
    const std::int64_t v = sh[i];
    const bool in_range = i < first ? v >= 0 && static_cast<std::size_t>(v) < first
                                    : static_cast<std::size_t>(v) >= first && static_cast<std::size_t>(v) < samples;
    if (!in_range || taken[static_cast<std::size_t>(v)])
      return defect("shuffle_index.npy", fmt::format("entry {} ({}) is a duplicate or outside its range", i, v));
    taken[static_cast<std::size_t>(v)] = true;
  }
  return std::nullopt;
}

std::optional<std::pair<std::string, std::string>> blending_defect(const BlendingIndices& indices, std::size_t size,
                                                                   std::span<const std::size_t> dataset_sizes) {
  const auto& di = indices.dataset_index;
  const auto& si = indices.dataset_sample_index;
  if (di.type() != NpyType::kInt16 || di.shape().size() != 1 || di.size() != size)
    return defect("dataset_index.npy", fmt::format("expected int16[{}]", size));
  if (si.type() != NpyType::kInt64 || si.shape().size() != 1 || si.size() != size)
    return defect("dataset_sample_index.npy", fmt::format("expected int64[{}]", size));
  std::vector<std::int64_t> taken(dataset_sizes.size(), 0);
  for (std::size_t i = 0; i < size; ++i) {
    const std::int64_t d = di[i];
    if (d < 0 || static_cast<std::size_t>(d) >= dataset_sizes.size())
      return defect("dataset_index.npy", fmt::format("entry {} names dataset {} of {}", i, d, dataset_sizes.size()));
    auto& t = taken[static_cast<std::size_t>(d)];
    if (si[i] != t || static_cast<std::size_t>(t) >= dataset_sizes[static_cast<std::size_t>(d)])
      return defect("dataset_sample_index.npy", fmt::format("entry {} is sample {} of dataset {}, expected {} of its {}",
                                                            i, si[i], d, t, dataset_sizes[static_cast<std::size_t>(d)]));
    ++t;
  }
  return std::nullopt;
}

}  // namespace dlm::data::detail
