// GPTDataset: its unique description, its cache files, and loading or building its index.
#include "dlm/data/gpt_dataset.h"

#include <sys/stat.h>

#include <cmath>
#include <filesystem>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "gpt_index.h"
#include "index_cache.h"
#include "md5.h"
#include "py_json.h"

namespace dlm::data {

namespace {
std::array<detail::NamedArray, 3> arrays_of(const GptIndex& index) {
  return {detail::NamedArray{"document_index", &index.document_index}, {"sample_index", &index.sample_index},
          {"shuffle_index", &index.shuffle_index}};
}
}  // namespace

namespace detail {

PyValue split_matrix_value(const std::optional<SplitMatrix>& matrix) {
  if (!matrix) return nullptr;
  PyList rows;
  for (std::size_t i = 0; i < matrix->size(); ++i) {
    const auto& row = (*matrix)[i];
    if (!row) {
      rows.emplace_back(nullptr);
    } else if (i == 0) {
      // Megatron's running sums start from the integer 0, so the first book-end prints as "0".
      rows.emplace_back(PyList{PyValue(std::int64_t{0}), PyValue(row->second)});
    } else {
      rows.emplace_back(PyList{PyValue(row->first), PyValue(row->second)});
    }
  }
  return rows;
}

PyValue optional_int(std::optional<std::int64_t> v) { return v ? PyValue(*v) : PyValue(nullptr); }

// MegatronDataset.unique_identifiers: class, path, num_samples, split, then the key config
// attributes (random_seed, sequence_length, split, split_matrix, tokenizer) in that order.
PyDict gpt_identifiers(const std::string& prefix, std::optional<std::int64_t> num_samples, Split split,
                       const GptIndexConfig& config) {
  PyDict d;
  d.emplace_back("class", "GPTDataset");
  d.emplace_back("dataset_path", prefix);
  d.emplace_back("num_samples", optional_int(num_samples));
  d.emplace_back("index_split", split_name(split));
  d.emplace_back("random_seed", std::int64_t{config.random_seed});
  d.emplace_back("sequence_length", std::int64_t{config.sequence_length});
  d.emplace_back("split", config.split ? PyValue(*config.split) : PyValue(nullptr));
  d.emplace_back("split_matrix", split_matrix_value(config.split_matrix));
  d.emplace_back("tokenizer", py_json_parse(config.tokenizer_identifiers, "tokenizer identifiers"));
  return d;
}

std::string gpt_cache_folder(const std::string& prefix, const GptIndexConfig& config) {
  return config.cache_path ? *config.cache_path : prefix + "/cache/GPTDataset_indices";
}

std::string gpt_cache_base(const std::string& folder, const std::string& hash, Split split) {
  return folder + "/" + hash + "-GPTDataset-" + split_name(split) + "-";
}

bool file_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace detail


GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> dataset, std::string prefix, std::int64_t begin,
                       std::int64_t end, std::optional<std::int64_t> num_samples, Split split,
                       const GptIndexConfig& config)
    : dataset_(std::move(dataset)), prefix_(std::move(prefix)), begin_(begin), end_(end),
      num_samples_(num_samples), split_(split), config_(config) {
  description_ = detail::py_json_dumps(detail::gpt_identifiers(prefix_, num_samples_, split_, config_));
  hash_ = detail::md5_hex(description_);
  const std::string cache = detail::gpt_cache_folder(prefix_, config_);
  if (config_.write_cache || config_.cache_path) cache_base_ = detail::gpt_cache_base(cache, hash_, split_);
  const bool drop_last = split_ != Split::kValid || config_.drop_last_partial_validation_sequence;
  try {
    plan_ = detail::plan_gpt_index(dataset_->sequence_lengths(), begin_, end_, num_samples_, drop_last, config_,
                                   std::string("the ") + split_name(split_) + " split");
  } catch (const Error& e) {
    fail_at(idx_path(prefix_), e.message());
  }
  if (!cache_base_.empty() && try_load_cache()) return;

  const std::int64_t sample_tokens = std::int64_t{config_.sequence_length} + (config_.add_extra_token_to_sequence ? 1 : 0);
  if (plan_.tokens < sample_tokens)
    log::warning("{}: the {} split holds {} tokens, fewer than one sample of {}; it is repeated over {} epochs, as "
                 "megatron-core does", idx_path(prefix_), split_name(split_), plan_.tokens, sample_tokens, plan_.epochs);
  const bool write = !cache_base_.empty() && config_.write_cache;
  if (write) {
    std::error_code ec;
    std::filesystem::create_directories(cache, ec);
    if (ec) fail_at(cache, "cannot create the index cache folder: " + ec.message());
    // A stale set loses its completion mark first, so a build cut short never leaves one that looks whole.
    std::filesystem::remove(cache_base_ + "description.txt", ec);
  }
  try {
    // The arrays go straight to their cache files.
    index_ = detail::build_gpt_index_into(dataset_->sequence_lengths(), plan_, begin_, end_, config_,
                                          write ? cache_base_ : std::string());
  } catch (const Error& e) {
    if (!e.where().file.empty()) throw;
    fail_at(idx_path(prefix_), std::string(split_name(split_)) + " split: " + e.message());
  }
  // Checksums, then the description: it marks a complete set (Megatron checks all four files).
  if (write) {
    detail::write_checksums(cache_base_, arrays_of(index_));
    write_file_atomically(cache_base_ + "description.txt", description_);
  }
}

bool GptDataset::try_load_cache() {
  const std::string files[] = {cache_base_ + "description.txt", cache_base_ + "document_index.npy",
                               cache_base_ + "sample_index.npy", cache_base_ + "shuffle_index.npy"};
  for (const auto& f : files)
    if (!detail::file_exists(f)) return false;
  auto reject = [&](const std::string& file, const std::string& why) {
    if (!config_.write_cache) fail_at(file, "index cache is unusable (" + why + "); remove it or allow rebuilding");
    log::warning("{}: index cache is unusable ({}); rebuilding it", file, why);
    return false;
  };
  if (read_text_file(files[0]) != description_) return reject(files[0], "its description differs from this dataset's");
  GptIndex index;
  try {
    index.document_index = NpyArray::load(files[1]);
    index.sample_index = NpyArray::load(files[2]);
    index.shuffle_index = NpyArray::load(files[3]);
  } catch (const Error& e) {
    return reject(e.where().file, e.message());
  }
  const bool drop_last = split_ != Split::kValid || config_.drop_last_partial_validation_sequence;
  if (const auto bad = detail::gpt_index_defect(index, plan_, dataset_->sequence_lengths(), begin_, end_, config_,
                                                drop_last))
    return reject(cache_base_ + bad->first, bad->second);
  if (const auto bad = detail::checksum_defect(cache_base_, arrays_of(index)))
    return reject(cache_base_ + bad->first, bad->second);
  index.num_epochs = plan_.epochs;
  index.tokens_per_epoch = plan_.tokens;
  index.separate_final_epoch = plan_.separate_final_epoch;
  index_ = std::move(index);
  from_cache_ = true;
  return true;
}

GptDataset::Span GptDataset::sample_span(std::size_t i) const {
  const auto& si = index_.sample_index;
  return {si[2 * i], si[2 * i + 1], si[2 * i + 2], si[2 * i + 3]};
}

}  // namespace dlm::data
