// BlendedMegatronDatasetBuilder and BlendedDataset: which GPTDatasets each split is made of, how
// many samples each is asked for, and the blend over them (with its cache).
#include <cmath>
#include <filesystem>
#include <algorithm>
#include <future>
#include <map>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "dlm/common/thread_pool.h"
#include "dlm/data/blend.h"
#include "blending.h"
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

using Sizes = std::array<std::optional<std::int64_t>, 3>;

class Builder {
 public:
  explicit Builder(const BuilderConfig& config) : config_(config) {}

  std::array<std::optional<SplitDataset>, 3> build();

 private:
  std::shared_ptr<const IndexedDataset> open(const std::string& prefix);
  using Splits = std::array<std::shared_ptr<const GptDataset>, 3>;
  std::vector<Splits> gpt_splits(const std::vector<std::string>& prefixes, const SplitMatrix& matrix,
                                 const std::vector<Sizes>& sizes, const GptIndexConfig& gpt);
  std::optional<SplitDataset> blend_split(Split split, std::vector<std::shared_ptr<const GptDataset>> datasets,
                                          std::optional<std::vector<double>> weights, std::optional<std::int64_t> size);

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

std::optional<SplitDataset> Builder::blend_split(Split split, std::vector<std::shared_ptr<const GptDataset>> datasets,
                                                 std::optional<std::vector<double>> weights,
                                                 std::optional<std::int64_t> size) {
  SplitDataset out;
  out.split = split;
  out.blended = true;
  out.blend_size = size;
  if (weights) {
    out.weights = normalize_weights(*weights);
  } else {
    for (const auto& d : datasets) {
      if (d->size() == 0)
        fail_at(idx_path(d->prefix()), std::string("the ") + split_name(split) + " split has no samples to blend");
      out.weights.push_back(static_cast<double>(d->size()));
    }
    if (size) out.weights = normalize_weights(out.weights);
    else out.integer_weights = true;
  }
  out.datasets = std::move(datasets);

  detail::PyDict ids;
  ids.emplace_back("class", "BlendedDataset");
  detail::PyList members;
  for (const auto& d : out.datasets)
    members.emplace_back(detail::gpt_identifiers(d->prefix(), d->num_samples_requested(), d->split(), d->config()));
  ids.emplace_back("datasets", std::move(members));
  ids.emplace_back("split", split_name(split));
  detail::PyList weights_list;
  for (double w : out.weights)
    weights_list.push_back(out.integer_weights ? detail::PyValue(static_cast<std::int64_t>(w)) : detail::PyValue(w));
  ids.emplace_back("weights", std::move(weights_list));
  ids.emplace_back("size", size ? detail::PyValue(*size) : detail::PyValue(nullptr));
  out.description = detail::py_json_dumps(ids);
  out.description_hash = detail::md5_hex(out.description);

  std::string base;
  if (config_.gpt.cache_path)
    base = *config_.gpt.cache_path + "/" + out.description_hash + "-BlendedDataset-" + split_name(split) + "-";
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

std::array<std::optional<SplitDataset>, 3> Builder::build() {
  std::array<std::optional<SplitDataset>, 3> result;
  const double surplus = config_.mid_level_dataset_surplus;
  // _get_size_per_split_per_dataset: ceil(ceil(size * w) * (1 + surplus)).
  auto per_dataset = [&](const std::vector<double>& weights, const Sizes& sizes, double margin, std::size_t d) {
    Sizes out;
    for (std::size_t i = 0; i < 3; ++i)
      if (sizes[i]) out[i] = static_cast<std::int64_t>(std::ceil(std::ceil(static_cast<double>(*sizes[i]) * weights[d]) * (1 + margin)));
    return out;
  };
  auto single = [&](std::shared_ptr<const GptDataset> d, Split split) {
    SplitDataset s;
    s.split = split;
    s.datasets.push_back(std::move(d));
    return s;
  };

  if (config_.blend) {
    if (!config_.split) fail("--split is required with --data-path");
    const Blend& blend = *config_.blend;
    GptIndexConfig gpt = config_.gpt;
    gpt.split = *config_.split;
    gpt.split_matrix = split_matrix(parse_split(*config_.split));
    const SplitMatrix& matrix = *gpt.split_matrix;
    if (blend.prefixes.size() == 1 && !blend.weights) {
      const auto splits = gpt_splits(blend.prefixes, matrix, {config_.sizes}, gpt)[0];
      for (std::size_t i = 0; i < 3; ++i)
        if (splits[i]) result[i] = single(splits[i], static_cast<Split>(i));
      return result;
    }
    std::optional<std::vector<double>> weights;
    if (blend.weights) weights = normalize_weights(*blend.weights);
    for (std::size_t i = 0; i < 3; ++i)
      if (weights && matrix[i] && !config_.sizes[i])
        fail(std::string("a weighted blend needs a sample count for the ") + split_name(static_cast<Split>(i)) + " split");
    std::vector<Sizes> sizes;
    for (std::size_t d = 0; d < blend.prefixes.size(); ++d)
      sizes.push_back(weights ? per_dataset(*weights, config_.sizes, surplus, d) : Sizes{});
    std::array<std::vector<std::shared_ptr<const GptDataset>>, 3> members;
    for (const auto& splits : gpt_splits(blend.prefixes, matrix, sizes, gpt))
      for (std::size_t i = 0; i < 3; ++i) members[i].push_back(splits[i]);
    for (std::size_t i = 0; i < 3; ++i) {
      if (!matrix[i]) continue;
      std::optional<std::int64_t> size;
      if (weights) {
        std::int64_t total = 0;
        for (std::size_t d = 0; d < blend.prefixes.size(); ++d) total += *per_dataset(*weights, config_.sizes, 0.0, d)[i];
        size = total;
      } else if (config_.sizes[i]) {
        std::int64_t available = 0;
        for (const auto& m : members[i]) available += static_cast<std::int64_t>(m->size());
        size = std::min(*config_.sizes[i], available);
      }
      result[i] = blend_split(static_cast<Split>(i), members[i], weights, size);
    }
    return result;
  }

  bool any = false;
  for (const auto& b : config_.blend_per_split) any = any || b.has_value();
  if (!any) fail("no data: give --data-path, or --train-data-path / --valid-data-path / --test-data-path");
  if (config_.split) fail("--split cannot be used with per-split data paths");
  for (std::size_t i = 0; i < 3; ++i) {
    if (!config_.blend_per_split[i]) continue;
    const Blend& blend = *config_.blend_per_split[i];
    const auto split = static_cast<Split>(i);
    SplitMatrix spoof;
    spoof[i] = std::make_pair(0.0, 1.0);
    Sizes sizes{std::int64_t{0}, std::int64_t{0}, std::int64_t{0}};
    sizes[i] = config_.sizes[i];
    GptIndexConfig gpt = config_.gpt;
    gpt.split.reset();
    gpt.split_matrix.reset();
    if (blend.prefixes.size() == 1) {
      result[i] = single(gpt_splits(blend.prefixes, spoof, {sizes}, gpt)[0][i], split);
      continue;
    }
    std::optional<std::vector<double>> weights;
    if (blend.weights) weights = normalize_weights(*blend.weights);
    if (weights && !sizes[i]) fail(std::string("a weighted blend needs a sample count for the ") + split_name(split) + " split");
    std::vector<Sizes> want;
    for (std::size_t d = 0; d < blend.prefixes.size(); ++d)
      want.push_back(weights ? per_dataset(*weights, sizes, surplus, d) : Sizes{});
    std::vector<std::shared_ptr<const GptDataset>> members;
    for (const auto& splits : gpt_splits(blend.prefixes, spoof, want, gpt)) members.push_back(splits[i]);
    std::optional<std::int64_t> size;
    if (weights) {
      std::int64_t total = 0;
      for (std::size_t d = 0; d < blend.prefixes.size(); ++d) total += *per_dataset(*weights, sizes, 0.0, d)[i];
      size = total;
    } else if (sizes[i]) {
      std::int64_t available = 0;
      for (const auto& m : members) available += static_cast<std::int64_t>(m->size());
      size = std::min(*sizes[i], available);
    }
    result[i] = blend_split(split, std::move(members), weights, size);
  }
  return result;
}

}  // namespace

std::array<std::optional<SplitDataset>, 3> build_datasets(const BuilderConfig& config) {
  if (config.gpt.sequence_length <= 1) fail("--seq-length must be at least 2");
  return Builder(config).build();
}

}  // namespace dlm::data
