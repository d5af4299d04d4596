// Megatron-LM's data arguments -> BuilderConfig, and the inspect report.
#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/data/blend_args.h"

namespace dlm::data {

std::array<std::int64_t, 3> megatron_split_sizes(const MegatronDataArgs& a) {
  if (a.global_batch_size <= 0) fail("--global-batch-size must be > 0");
  if (a.train_samples.has_value() == a.train_iters.has_value()) fail("give exactly one of --train-samples and --train-iters");
  if (a.eval_interval <= 0) fail("--eval-interval must be > 0");
  if (a.eval_iters < 0) fail("--eval-iters must be >= 0");
  const std::int64_t gbs = a.global_batch_size;
  std::int64_t train_iters, train_samples;
  if (a.train_samples) {
    if (*a.train_samples <= 0) fail("--train-samples must be > 0");
    train_samples = *a.train_samples;
    train_iters = train_samples / gbs;
  } else {
    if (*a.train_iters <= 0) fail("--train-iters must be > 0");
    train_iters = *a.train_iters;
    train_samples = train_iters * gbs;
  }
  return {train_samples, (train_iters / a.eval_interval + 1) * a.eval_iters * gbs, a.eval_iters * gbs};
}

std::array<std::optional<std::int64_t>, 3> megatron_split_request(const MegatronDataArgs& a) {
  const auto sizes = megatron_split_sizes(a);
  std::array<std::optional<std::int64_t>, 3> request{sizes[0], sizes[1], sizes[2]};
  if (a.full_validation) request[1].reset();
  return request;
}

BuilderConfig builder_config(const MegatronDataArgs& a) {
  BuilderConfig c;
  if (a.seq_length <= 1) fail("--seq-length must be at least 2");
  c.gpt.random_seed = a.seed;
  c.gpt.sequence_length = a.seq_length;
  c.gpt.add_extra_token_to_sequence = a.add_extra_token_to_sequence;
  c.gpt.cache_path = a.data_cache_path;
  if (!a.tokenizer_identifiers.empty()) c.gpt.tokenizer_identifiers = a.tokenizer_identifiers;
  c.sizes = megatron_split_request(a);
  const bool per_split = !a.train_data_path.empty() || !a.valid_data_path.empty() || !a.test_data_path.empty();
  if (!a.data_path.empty() && per_split) fail("--data-path cannot be combined with --train/valid/test-data-path");
  if (!a.data_path.empty()) {
    c.blend = parse_blend(a.data_path);
    c.split = a.split;
  } else if (per_split) {
    if (!a.train_data_path.empty()) c.blend_per_split[0] = parse_blend(a.train_data_path, "--train-data-path");
    if (!a.valid_data_path.empty()) c.blend_per_split[1] = parse_blend(a.valid_data_path, "--valid-data-path");
    if (!a.test_data_path.empty()) c.blend_per_split[2] = parse_blend(a.test_data_path, "--test-data-path");
  } else {
    fail("no data: give --data-path, or --train-data-path / --valid-data-path / --test-data-path");
  }
  const auto& valid = c.blend ? c.blend : c.blend_per_split[1];
  if (a.full_validation && valid && valid->weights)
    fail("--full-validation evaluates one epoch of the validation split, which a weighted blend has not (Megatron "
         "asserts the same): give the validation prefixes without weights");
  return c;
}

std::string inspect_report(const std::array<std::optional<SplitDataset>, 3>& splits) {
  std::string out;
  for (const auto& s : splits) {
    if (!s) continue;
    out += fmt::format("{}: {} samples{}\n", split_name(s->split), s->size(),
                       s->blended ? fmt::format(" (blend of {}{}{})", s->datasets.size(),
                                                s->loaded_from_cache ? ", cached" : "",
                                                s->description_hash.empty() ? "" : ", " + s->description_hash)
                                  : "");
    std::vector<std::int64_t> taken(s->datasets.size(), 0);
    if (s->blended)
      for (std::size_t i = 0; i < s->indices.dataset_index.size(); ++i) ++taken[static_cast<std::size_t>(s->indices.dataset_index[i])];
    double weight_sum = 0;
    for (double w : s->weights) weight_sum += w;
    for (std::size_t d = 0; d < s->datasets.size(); ++d) {
      const auto& ds = *s->datasets[d];
      const auto& ix = ds.index();
      std::string weights = "weight 1 (alone)";
      if (s->blended) {
        const double effective = s->size() ? static_cast<double>(taken[d]) / static_cast<double>(s->size()) : 0.0;
        weights = fmt::format("weight requested {:.6f} effective {:.6f} ({} samples taken)", s->weights[d] / weight_sum,
                              effective, taken[d]);
      }
      out += fmt::format("  {} sequences [{}, {}): {}; {} tokens/epoch, {} epoch{}{}, {} samples built{}; {}\n",
                         ds.prefix(), ds.begin(), ds.end(), weights, ix.tokens_per_epoch, ix.num_epochs,
                         ix.num_epochs == 1 ? "" : "s", ix.separate_final_epoch ? " (final epoch shuffled apart)" : "",
                         ds.size(), ds.loaded_from_cache() ? " (cached)" : "",
                         ds.cache_base().empty() ? "not cached" : ds.cache_base() + "*");
    }
  }
  return out;
}

}  // namespace dlm::data
