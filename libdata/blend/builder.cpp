// BlendedMegatronDatasetBuilder and BlendedDataset: which GPTDatasets each split is made of, how
// many samples each is asked for, and the blend over them (with its cache).
#include <algorithm>
#include <filesystem>
#include <future>
#include <map>

#include <fmt/format.h>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "dlm/common/thread_pool.h"
#include "dlm/data/blend.h"
#include "blending.h"
#include "build_plan.h"
#include "gpt_index.h"
#include "index_cache.h"
#include "md5.h"
#include "npy_output.h"
#include "py_json.h"

namespace dlm::data {

namespace detail {
PyDict gpt_identifiers(const std::string& prefix, std::optional<std::int64_t> num_samples, Split split,
                       const GptIndexConfig& config);
bool file_exists(const std::string& path);
}  // namespace detail

std::size_t SplitDataset::size() const {
  return blended ? indices.dataset_index.size() : datasets.front()->size();
}

std::pair<std::size_t, std::size_t> SplitDataset::locate(std::size_t i) const {
  if (!blended) return {0, i};
  return {static_cast<std::size_t>(indices.dataset_index[i]), static_cast<std::size_t>(indices.dataset_sample_index[i])};
}

namespace {

std::array<detail::NamedArray, 2> blending_arrays(const BlendingIndices& b) {
  return {detail::NamedArray{"dataset_index", &b.dataset_index}, {"dataset_sample_index", &b.dataset_sample_index}};
}

using detail::BlendGroup;
using detail::Sizes;

// BlendedDataset's weights and unique description for split i of group g, its members holding
// `samples` samples: the normalized weights, or (unweighted) the members' sizes, normalized when
// the blend has a size.
struct BlendNaming {
  std::vector<double> weights;
  bool integer_weights = false;
  std::string description, hash;
};

BlendNaming blend_naming(const BlendGroup& g, std::size_t i, const std::vector<std::int64_t>& samples,
                         std::optional<std::int64_t> size) {
  const auto split = static_cast<Split>(i);
  BlendNaming out;
  if (g.weights) {
    out.weights = normalize_weights(*g.weights);
  } else {
    for (std::size_t d = 0; d < samples.size(); ++d) {
      if (samples[d] == 0)
        fail_at(idx_path(g.prefixes[d]), std::string("the ") + split_name(split) + " split has no samples to blend");
      out.weights.push_back(static_cast<double>(samples[d]));
    }
    if (size) out.weights = normalize_weights(out.weights);
    else out.integer_weights = true;
  }
  detail::PyDict ids;
  ids.emplace_back("class", "BlendedDataset");
  detail::PyList members;
  for (std::size_t d = 0; d < g.prefixes.size(); ++d)
    members.emplace_back(detail::gpt_identifiers(g.prefixes[d], g.buffers[d][i], split, g.gpt));
  ids.emplace_back("datasets", std::move(members));
  ids.emplace_back("split", split_name(split));
  detail::PyList weights_list;
  for (double w : out.weights)
    weights_list.push_back(out.integer_weights ? detail::PyValue(static_cast<std::int64_t>(w)) : detail::PyValue(w));
  ids.emplace_back("weights", std::move(weights_list));
  ids.emplace_back("size", size ? detail::PyValue(*size) : detail::PyValue(nullptr));
  out.description = detail::py_json_dumps(ids);
  out.hash = detail::md5_hex(out.description);
  return out;
}

std::optional<std::int64_t> blend_size_of(const BlendGroup& g, std::size_t i, const std::vector<std::int64_t>& samples) {
  if (!g.weights && !g.requested[i]) return std::nullopt;  // exhaustive
  return detail::blended_size(g, i, samples);
}

class Builder {
 public:
  explicit Builder(const BuilderConfig& config) : config_(config) {}

  std::array<std::optional<SplitDataset>, 3> build();

 private:
  std::shared_ptr<const IndexedDataset> open(const std::string& prefix);
  using Splits = std::array<std::shared_ptr<const GptDataset>, 3>;
  std::vector<Splits> gpt_splits(const std::vector<std::string>& prefixes, const SplitMatrix& matrix,
                                 const std::vector<Sizes>& sizes, const GptIndexConfig& gpt);
  std::optional<SplitDataset> blend_split(const BlendGroup& g, std::size_t i,
                                          std::vector<std::shared_ptr<const GptDataset>> datasets);
  void check_space(const std::vector<BlendGroup>& groups);
  std::string blend_cache_base(const std::string& hash, Split split) const;

  const BuilderConfig& config_;
  ThreadPool pool_;
  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened_;
  std::optional<DType> dtype_;
  std::string dtype_prefix_;
};

std::shared_ptr<const IndexedDataset> Builder::open(const std::string& prefix) {
  auto it = opened_.find(prefix);
  if (it != opened_.end()) return it->second;
  auto ds = std::make_shared<const IndexedDataset>(prefix);
  if (dtype_ && *dtype_ != ds->dtype())
    fail_at(idx_path(prefix), std::string("token dtype ") + dtype_name(ds->dtype()) + " differs from " +
                                  dtype_name(*dtype_) + " of " + dtype_prefix_ + "; blended datasets must share one dtype");
  if (!dtype_) {
    dtype_ = ds->dtype();
    dtype_prefix_ = prefix;
  }
  opened_.emplace(prefix, ds);
  return ds;
}

// _build_megatron_dataset_splits for each prefix: one GPTDataset per split the matrix keeps, the
// prefix's sizes[d][split] samples. Every index is independent of the others, so they are built at
// once on the pool, the largest first; the first error in (prefix, split) order is the one reported.
std::vector<Builder::Splits> Builder::gpt_splits(const std::vector<std::string>& prefixes, const SplitMatrix& matrix,
                                                 const std::vector<Sizes>& sizes, const GptIndexConfig& gpt) {
  struct Job { std::size_t d, split; std::int64_t samples; };
  std::vector<std::shared_ptr<const IndexedDataset>> opened;
  std::vector<Job> jobs;
  for (std::size_t d = 0; d < prefixes.size(); ++d) {
    opened.push_back(open(prefixes[d]));
    for (std::size_t i = 0; i < 3; ++i)
      if (matrix[i]) jobs.push_back({d, i, sizes[d][i].value_or(0)});
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.samples > b.samples; });
  std::vector<std::array<std::future<std::shared_ptr<const GptDataset>>, 3>> pending(prefixes.size());
  for (const Job& j : jobs) {
    pending[j.d][j.split] = pool_.submit([&, j] {
      const auto [begin, end] = split_range(*matrix[j.split], opened[j.d]->num_sequences());
      return std::make_shared<const GptDataset>(opened[j.d], prefixes[j.d], begin, end, sizes[j.d][j.split],
                                                static_cast<Split>(j.split), gpt);
    });
  }
  for (auto& p : pending)
    for (auto& f : p)
      if (f.valid()) f.wait();
  std::vector<Splits> out(prefixes.size());
  for (std::size_t d = 0; d < prefixes.size(); ++d)
    for (std::size_t i = 0; i < 3; ++i)
      if (pending[d][i].valid()) out[d][i] = pending[d][i].get();
  return out;
}

std::string Builder::blend_cache_base(const std::string& hash, Split split) const {
  return config_.gpt.cache_path ? *config_.gpt.cache_path + "/" + hash + "-BlendedDataset-" + split_name(split) + "-" : "";
}

std::optional<SplitDataset> Builder::blend_split(const BlendGroup& g, std::size_t i,
                                                 std::vector<std::shared_ptr<const GptDataset>> datasets) {
  const auto split = static_cast<Split>(i);
  std::vector<std::int64_t> samples;
  for (const auto& d : datasets) samples.push_back(static_cast<std::int64_t>(d->size()));
  const auto size = blend_size_of(g, i, samples);
  BlendNaming naming = blend_naming(g, i, samples, size);
  SplitDataset out;
  out.split = split;
  out.blended = true;
  out.blend_size = size;
  out.weights = std::move(naming.weights);
  out.integer_weights = naming.integer_weights;
  out.description = std::move(naming.description);
  out.description_hash = std::move(naming.hash);
  out.datasets = std::move(datasets);

  const std::string base = blend_cache_base(out.description_hash, split);
  const std::string files[] = {base + "description.txt", base + "dataset_index.npy", base + "dataset_sample_index.npy"};
  const std::int64_t n = size ? *size : [&] {
    std::int64_t t = 0;
    for (double w : out.weights) t += static_cast<std::int64_t>(w);
    return t;
  }();
  if (!base.empty() && detail::file_exists(files[0]) && detail::file_exists(files[1]) && detail::file_exists(files[2])) {
    std::string why, where;
    try {
      if (read_text_file(files[0]) != out.description) {
        why = "its description differs from this blend's";
        where = files[0];
      } else {
        BlendingIndices cached{NpyArray::load(files[1]), NpyArray::load(files[2])};
        std::vector<std::size_t> sizes;
        for (const auto& d : out.datasets) sizes.push_back(d->size());
        if (const auto bad = detail::blending_defect(cached, static_cast<std::size_t>(n), sizes)) {
          where = base + bad->first;
          why = bad->second;
        } else if (const auto sum = detail::checksum_defect(base, blending_arrays(cached))) {
          where = base + sum->first;
          why = sum->second;
        }
        if (why.empty()) {
          out.indices = std::move(cached);
          out.loaded_from_cache = true;
          return out;
        }
      }
    } catch (const Error& e) {
      why = e.message();
      where = e.where().file.empty() ? files[1] : e.where().file;
    }
    if (!config_.gpt.write_cache) fail_at(where, "index cache is unusable (" + why + "); remove it or allow rebuilding");
    log::warning("{}: index cache is unusable ({}); rebuilding it", where, why);
  }

  const bool write = !base.empty() && config_.gpt.write_cache;
  if (write) {
    std::error_code ec;
    std::filesystem::create_directories(*config_.gpt.cache_path, ec);
    if (ec) fail_at(*config_.gpt.cache_path, "cannot create the index cache folder: " + ec.message());
    std::filesystem::remove(files[0], ec);  // a stale set loses its completion mark first
  }
  // Built straight into the cache files; the description goes last, marking a complete set.
  detail::NpyOutput<std::int16_t> dataset(write ? files[1] : std::string(), {static_cast<std::size_t>(n)});
  detail::NpyOutput<std::int64_t> sample(write ? files[2] : std::string(), {static_cast<std::size_t>(n)});
  if (size) {
    detail::fill_blending_indices(out.weights, dataset.data(), sample.data());
  } else {
    std::vector<std::int64_t> sizes;
    for (double w : out.weights) sizes.push_back(static_cast<std::int64_t>(w));
    detail::fill_exhaustive_blending_indices(sizes, dataset.data(), sample.data());
  }
  std::vector<std::int64_t> counts(out.datasets.size(), 0);
  for (const auto d : dataset.data()) ++counts[static_cast<std::size_t>(d)];
  for (std::size_t d = 0; d < counts.size(); ++d)
    if (static_cast<std::size_t>(counts[d]) > out.datasets[d]->size())
      fail_at(idx_path(out.datasets[d]->prefix()),
              std::string("the ") + split_name(split) + " blend takes " + std::to_string(counts[d]) +
                  " samples from this dataset, which has " + std::to_string(out.datasets[d]->size()) +
                  "; raise the surplus (mid_level_dataset_surplus " + std::to_string(config_.mid_level_dataset_surplus) + ")");
  out.indices.dataset_index = dataset.commit();
  out.indices.dataset_sample_index = sample.commit();
  if (write) {
    detail::write_checksums(base, blending_arrays(out.indices));
    write_file_atomically(files[0], out.description);
  }
  return out;
}

// The bytes every index not already cached will take, per cache folder (or in memory when no
// cache is written), checked against what is free before anything is built.
void Builder::check_space(const std::vector<BlendGroup>& groups) {
  std::vector<detail::SpaceNeed> needs;
  const bool write = config_.gpt.write_cache;
  for (const auto& g : groups) {
    for (std::size_t i = 0; i < 3; ++i) {
      if (!g.matrix[i]) continue;
      const auto split = static_cast<Split>(i);
      const bool drop_last = split != Split::kValid || g.gpt.drop_last_partial_validation_sequence;
      std::vector<std::int64_t> samples;
      std::vector<detail::SpaceNeed> split_needs;
      for (std::size_t d = 0; d < g.prefixes.size(); ++d) {
        const auto ds = open(g.prefixes[d]);
        const auto [begin, end] = split_range(*g.matrix[i], ds->num_sequences());
        GptIndexPlan plan;
        try {
          plan = detail::plan_gpt_index(ds->sequence_lengths(), begin, end, g.buffers[d][i], drop_last, g.gpt,
                                        std::string("the ") + split_name(split) + " split");
        } catch (const Error& e) {
          fail_at(idx_path(g.prefixes[d]), e.message());
        }
        samples.push_back(plan.samples);
        const std::string folder = detail::gpt_cache_folder(g.prefixes[d], g.gpt);
        const std::string hash =
            detail::md5_hex(detail::py_json_dumps(detail::gpt_identifiers(g.prefixes[d], g.buffers[d][i], split, g.gpt)));
        if (!detail::file_exists(detail::gpt_cache_base(folder, hash, split) + "description.txt"))
          split_needs.push_back({write ? std::optional(folder) : std::nullopt, plan.bytes(), ""});
      }
      std::int64_t total = 0;
      for (auto n : samples) total += n;
      std::string what = fmt::format("{}: {} samples over {} dataset{}", split_name(split), total, samples.size(),
                                     samples.size() == 1 ? "" : "s");
      if (!g.single) {
        const auto size = blend_size_of(g, i, samples);
        what = fmt::format("{}: {} blended samples of {} over {} datasets", split_name(split), size.value_or(total),
                           total, samples.size());
        const std::string base = blend_cache_base(blend_naming(g, i, samples, size).hash, split);
        if (base.empty() || !detail::file_exists(base + "description.txt"))
          split_needs.push_back({write && !base.empty() ? config_.gpt.cache_path : std::nullopt,
                                 256 + 10 * static_cast<std::uint64_t>(size.value_or(total)), ""});
      }
      for (auto& n : split_needs) n.what = what;
      needs.insert(needs.end(), split_needs.begin(), split_needs.end());
    }
  }
  detail::check_space(needs);
}

std::array<std::optional<SplitDataset>, 3> Builder::build() {
  const auto groups = detail::blend_layout(config_);
  check_space(groups);
  std::array<std::optional<SplitDataset>, 3> result;
  for (const auto& g : groups) {
    const auto built = gpt_splits(g.prefixes, g.matrix, g.buffers, g.gpt);
    for (std::size_t i = 0; i < 3; ++i) {
      if (!g.matrix[i]) continue;
      if (g.single) {
        SplitDataset s;
        s.split = static_cast<Split>(i);
        s.datasets.push_back(built[0][i]);
        result[i] = std::move(s);
        continue;
      }
      std::vector<std::shared_ptr<const GptDataset>> members;
      for (const auto& splits : built) members.push_back(splits[i]);
      result[i] = blend_split(g, i, std::move(members));
    }
  }
  return result;
}

}  // namespace

std::array<std::optional<SplitDataset>, 3> build_datasets(const BuilderConfig& config) {
  if (config.gpt.sequence_length <= 1) fail("--seq-length must be at least 2");
  return Builder(config).build();
}

}  // namespace dlm::data
