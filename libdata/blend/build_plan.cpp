// BlendedMegatronDatasetBuilder's case analysis, and the disk and memory a build needs (build_plan.h).
#include "build_plan.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cmath>
#include <fmt/format.h>
#include <filesystem>
#include <fstream>
#include <map>

#include "dlm/common/error.h"

namespace dlm::data::detail {

namespace {

// _get_size_per_split_per_dataset: ceil(ceil(size * w) * (1 + surplus)).
Sizes per_dataset(const std::vector<double>& weights, const Sizes& sizes, double surplus, std::size_t d) {
  Sizes out;
  for (std::size_t i = 0; i < 3; ++i) {
    if (!sizes[i]) continue;
    const double n = std::ceil(std::ceil(static_cast<double>(*sizes[i]) * weights[d]) * (1 + surplus));
    if (!(n < 0x1p62)) fail(fmt::format("{} samples asked of the {} split overflow a 64-bit count", *sizes[i], split_name(static_cast<Split>(i))));
    out[i] = static_cast<std::int64_t>(n);
  }
  return out;
}

// The group of one blend: its members' sample counts and the blended sizes.
BlendGroup group_of(const Blend& blend, const SplitMatrix& matrix, const Sizes& sizes, const GptIndexConfig& gpt,
                    bool single, double surplus) {
  BlendGroup g;
  g.prefixes = blend.prefixes;
  g.matrix = matrix;
  g.gpt = gpt;
  g.single = single;
  g.requested = sizes;
  if (single) {
    g.buffers.assign(1, sizes);
    return g;
  }
  if (blend.weights) g.weights = normalize_weights(*blend.weights);
  for (std::size_t i = 0; i < 3; ++i)
    if (g.weights && matrix[i] && !sizes[i])
      fail(std::string("a weighted blend needs a sample count for the ") + split_name(static_cast<Split>(i)) + " split");
  for (std::size_t d = 0; d < g.prefixes.size(); ++d) {
    g.buffers.push_back(g.weights ? per_dataset(*g.weights, sizes, surplus, d) : Sizes{});
    if (!g.weights) continue;
    const Sizes target = per_dataset(*g.weights, sizes, 0.0, d);
    for (std::size_t i = 0; i < 3; ++i)
      if (target[i]) g.targets[i] = g.targets[i].value_or(0) + *target[i];
  }
  return g;
}

std::string bytes_text(std::uint64_t b) {
  if (b < (1u << 20)) return fmt::format("{} bytes", b);
  const char* units[] = {"MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(b) / (1 << 20);
  std::size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(units)) v /= 1024, ++u;
  return fmt::format("{:.1f} {}", v, units[u]);
}

// The nearest existing folder at or above `folder` (the cache folder may not exist yet).
std::string existing_ancestor(const std::string& folder) {
  std::filesystem::path p = std::filesystem::absolute(folder);
  std::error_code ec;
  while (!std::filesystem::is_directory(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  return p.string();
}

std::uint64_t memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    in.ignore(256, '\n');
  }
  return UINT64_MAX;  // unknown: do not refuse
}

}  // namespace

std::vector<BlendGroup> blend_layout(const BuilderConfig& config) {
  const double surplus = config.mid_level_dataset_surplus;
  if (config.blend) {
    if (!config.split) fail("--split is required with --data-path");
    GptIndexConfig gpt = config.gpt;
    gpt.split = *config.split;
    gpt.split_matrix = split_matrix(parse_split(*config.split));
    const bool single = config.blend->prefixes.size() == 1 && !config.blend->weights;
    return {group_of(*config.blend, *gpt.split_matrix, config.sizes, gpt, single, surplus)};
  }
  bool any = false;
  for (const auto& b : config.blend_per_split) any = any || b.has_value();
  if (!any) fail("no data: give --data-path, or --train-data-path / --valid-data-path / --test-data-path");
  if (config.split) fail("--split cannot be used with per-split data paths");
  std::vector<BlendGroup> groups;
  for (std::size_t i = 0; i < 3; ++i) {
    if (!config.blend_per_split[i]) continue;
    SplitMatrix spoof;
    spoof[i] = std::make_pair(0.0, 1.0);
    Sizes sizes{std::int64_t{0}, std::int64_t{0}, std::int64_t{0}};
    sizes[i] = config.sizes[i];
    GptIndexConfig gpt = config.gpt;
    gpt.split.reset();
    gpt.split_matrix.reset();
    const Blend& blend = *config.blend_per_split[i];
    groups.push_back(group_of(blend, spoof, sizes, gpt, blend.prefixes.size() == 1, surplus));
  }
  return groups;
}

std::int64_t blended_size(const BlendGroup& g, std::size_t split, const std::vector<std::int64_t>& member_samples) {
  if (g.weights) return *g.targets[split];
  std::int64_t available = 0;
  for (auto n : member_samples) available += n;
  return g.requested[split] ? std::min(*g.requested[split], available) : available;
}

void check_space(const std::vector<SpaceNeed>& needs) {
  struct Total {
    std::string folder;
    std::uint64_t bytes = 0;
    std::string what;
  };
  std::map<std::uint64_t, Total> by_device;  // st_dev -> need; memory under UINT64_MAX
  for (const auto& n : needs) {
    if (n.bytes == 0) continue;
    std::uint64_t key = UINT64_MAX;
    std::string folder = "memory";
    if (n.folder) {
      folder = existing_ancestor(*n.folder);
      struct stat st{};
      if (::stat(folder.c_str(), &st) == 0) key = static_cast<std::uint64_t>(st.st_dev);
      folder = *n.folder;
    }
    auto& t = by_device[key];
    if (t.folder.empty()) t.folder = folder;
    t.bytes += n.bytes;
    if (t.what.find(n.what) == std::string::npos) t.what += (t.what.empty() ? "" : "; ") + n.what;
  }
  for (const auto& [device, t] : by_device) {
    std::uint64_t free = 0;
    if (device == UINT64_MAX) {
      free = memory_available();
    } else {
      struct statvfs vfs{};
      if (::statvfs(existing_ancestor(t.folder).c_str(), &vfs) != 0) continue;
      free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    }
    if (t.bytes <= free) continue;
    if (device == UINT64_MAX)
      fail(fmt::format("the indices to build need {} of memory ({}; no cache is written) and {} is available; nothing "
                       "was built", bytes_text(t.bytes), t.what, bytes_text(free)));
    fail_at(t.folder, fmt::format("the indices to build need {} ({}) and this filesystem has {} free; nothing was "
                                  "written", bytes_text(t.bytes), t.what, bytes_text(free)));
  }
}

}  // namespace dlm::data::detail
