// GPTDataset's document, sample and shuffle indices (gpt_dataset.py and helpers.cpp's
// build_sample_idx), reproduced exactly.
//
// Each array is built where it is kept (its cache file, mapped) and never copied: the document
// index is tiled and shuffled in place, the sample index written in one pass over it, the shuffle
// index drawn in place. The shuffle index needs only the generator's state after the document
// shuffle, so it is drawn on a second thread while the sample index is built.
#include "gpt_index.h"

#include <cmath>
#include <future>
#include <limits>
#include <numeric>
#include <vector>

#include "dlm/common/error.h"
#include "fast_shuffle.h"
#include "npy_output.h"

namespace dlm::data {

const char* split_name(Split split) {
  switch (split) {
    case Split::kTrain: return "train";
    case Split::kValid: return "valid";
    case Split::kTest: return "test";
  }
  return "?";
}

std::uint64_t GptIndexPlan::bytes() const {
  const std::size_t doc_shape[] = {static_cast<std::size_t>(documents)};
  const std::size_t sample_shape[] = {static_cast<std::size_t>(samples + 1), 2};
  const std::size_t shuffle_shape[] = {static_cast<std::size_t>(samples)};
  return npy_header(NpyType::kInt32, doc_shape).size() + 4 * documents +
         npy_header(NpyType::kInt64, sample_shape).size() + (sample_index_int64 ? 8u : 4u) * 2 * (static_cast<std::uint64_t>(samples) + 1) +
         npy_header(NpyType::kInt64, shuffle_shape).size() + (shuffle_index_int64 ? 8u : 4u) * static_cast<std::uint64_t>(samples);
}

namespace {

using Lengths = UnalignedArray<std::int32_t>;

// The lengths of the documents at positions [begin, end) of the document index, in order: a gather
// with no dependence between its reads, so the misses overlap (and are prefetched kAhead early).
void gather_lengths(Lengths lengths, std::span<const std::int32_t> documents, std::size_t begin, std::size_t end,
                    std::int32_t* out) {
  constexpr std::size_t kAhead = 64;
  const std::uint8_t* bytes = lengths.bytes();
  for (std::size_t p = begin; p < end; ++p) {
    if (p + kAhead < end) __builtin_prefetch(bytes + 4 * static_cast<std::size_t>(documents[p + kAhead]));
    out[p - begin] = lengths[static_cast<std::size_t>(documents[p])];
  }
}

// helpers.cpp build_sample_idx: walk the document index, cutting a sample every L tokens; each
// sample spans L + extra tokens, so the next one starts `extra` tokens before this one ends.
// The walk reads the documents' lengths from blocks gathered ahead of it.
template <typename T>
void fill_sample_index(Lengths lengths, std::span<const std::int32_t> documents, std::int32_t seq_length,
                       std::int64_t num_samples, std::int32_t extra, std::span<T> out) {
  constexpr std::size_t kBlock = 1 << 14;
  std::vector<std::int32_t> block(kBlock);
  std::size_t block_begin = 0, block_end = std::min(kBlock, documents.size());
  gather_lengths(lengths, documents, block_begin, block_end, block.data());
  const std::size_t last = documents.size() - 1;
  std::size_t doc = 0;
  T offset = 0;
  std::int32_t length = block[0];
  out[0] = 0;
  out[1] = 0;
  for (std::size_t s = 1; s <= static_cast<std::size_t>(num_samples); ++s) {
    std::int32_t remaining = seq_length + extra;
    while (remaining != 0) {
      const auto doc_length = static_cast<std::int32_t>(length - offset);
      remaining -= doc_length;
      if (remaining <= 0) {
        offset += static_cast<T>(remaining + doc_length - extra);
        remaining = 0;
      } else if (doc == last) {
        // The data ran out: only the final sample (drop_last_partial off) ends here.
        offset = static_cast<T>(length - extra);
        break;
      } else {
        if (++doc == block_end) {
          block_begin = doc;
          block_end = std::min(doc + kBlock, documents.size());
          gather_lengths(lengths, documents, block_begin, block_end, block.data());
        }
        length = block[doc - block_begin];
        offset = 0;
      }
    }
    out[2 * s] = static_cast<T>(doc);
    out[2 * s + 1] = offset;
  }
}

template <typename T>
NpyArray sample_index(Lengths lengths, std::span<const std::int32_t> documents, std::int32_t seq_length,
                      std::int64_t num_samples, std::int32_t extra, const std::string& path) {
  detail::NpyOutput<T> out(path, {static_cast<std::size_t>(num_samples + 1), 2});
  fill_sample_index<T>(lengths, documents, seq_length, num_samples, extra, out.data());
  return out.commit();
}

// _build_shuffle_index: [0, first) and [first, total) each shuffled, by the same generator.
template <typename T>
NpyArray shuffle_index(std::int64_t first, std::int64_t total, NumpyRandomState rng, const std::string& path) {
  detail::NpyOutput<T> out(path, {static_cast<std::size_t>(total)});
  const auto x = out.data();
  std::iota(x.begin(), x.end(), T{0});
  const auto split = static_cast<std::size_t>(first);
  detail::shuffle_like_numpy(x.first(split), rng);
  if (split != x.size()) detail::shuffle_like_numpy(x.subspan(split), rng);
  return out.commit();
}

std::string path_of(const std::string& cache_base, const char* name) {
  return cache_base.empty() ? std::string() : cache_base + name + ".npy";
}

}  // namespace

namespace detail {

GptIndexPlan plan_gpt_index(Lengths lengths, std::int64_t begin, std::int64_t end,
                            std::optional<std::int64_t> num_samples, bool drop_last_partial,
                            const GptIndexConfig& config, const std::string& what) {
  const std::int64_t L = config.sequence_length;
  const std::int32_t extra = config.add_extra_token_to_sequence ? 1 : 0;
  if (L <= 1) fail("sequence length " + std::to_string(L) + " must be at least 2");
  if (num_samples && *num_samples < 0) fail(what + ": a demand of " + std::to_string(*num_samples) + " samples");
  const std::string forever = num_samples ? "; megatron-core would loop forever on it" : "";
  if (begin < 0 || end > static_cast<std::int64_t>(lengths.size()))
    fail(what + ": the document range [" + std::to_string(begin) + ", " + std::to_string(end) + ") is outside the " +
         std::to_string(lengths.size()) + " sequences");
  if (begin >= end)
    fail(what + " holds no sequences (range [" + std::to_string(begin) + ", " + std::to_string(end) + "))" + forever);

  GptIndexPlan plan;
  for (std::int64_t i = begin; i < end; ++i) plan.tokens += lengths[static_cast<std::size_t>(i)];
  if (plan.tokens == 0)
    fail(what + " holds " + std::to_string(end - begin) + " sequences of no tokens" + forever);

  // _get_num_epochs: the least E >= 1 with E * tokens >= num_samples * L + extra.
  if (num_samples) {
    std::int64_t wanted = 0;
    if (__builtin_mul_overflow(*num_samples, L, &wanted) || __builtin_add_overflow(wanted, extra, &wanted))
      fail(what + ": " + std::to_string(*num_samples) + " samples of " + std::to_string(L) + " tokens overflow a 64-bit token count");
    plan.epochs = std::max<std::int64_t>(1, wanted / plan.tokens + (wanted % plan.tokens != 0));
  }
  // helpers.cpp's build_sample_idx takes the epoch count as int32.
  if (plan.epochs > std::numeric_limits<std::int32_t>::max())
    fail(what + ": " + std::to_string(num_samples.value_or(0)) + " samples from " + std::to_string(plan.tokens) +
         " tokens need " + std::to_string(plan.epochs) + " epochs; megatron-core's helpers take at most 2^31-1");
  plan.documents = static_cast<std::uint64_t>(plan.epochs) * static_cast<std::uint64_t>(end - begin);

  if (plan.epochs > 1) {
    plan.samples_before_final = ((plan.epochs - 1) * plan.tokens - extra) / L;
    const std::int64_t from_final = *num_samples - plan.samples_before_final;
    const std::int64_t per_epoch = (plan.tokens - extra) / L;
    plan.separate_final_epoch = from_final < static_cast<std::int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  if (drop_last_partial) {
    plan.samples = (plan.epochs * plan.tokens - extra) / L;
  } else {
    // helpers.cpp computes this in single precision.
    plan.samples = static_cast<std::int64_t>(
        std::ceil(static_cast<float>(plan.epochs * plan.tokens - extra) / static_cast<float>(L)));
  }
  plan.sample_index_int64 = plan.documents > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());
  plan.shuffle_index_int64 = plan.samples >= static_cast<std::int64_t>(std::numeric_limits<std::uint32_t>::max()) - 1;
  return plan;
}

GptIndex build_gpt_index_into(Lengths lengths, const GptIndexPlan& plan, std::int64_t begin, std::int64_t end,
                              const GptIndexConfig& config, const std::string& cache_base) {
  const std::int32_t extra = config.add_extra_token_to_sequence ? 1 : 0;
  GptIndex index;
  index.tokens_per_epoch = plan.tokens;
  index.num_epochs = plan.epochs;
  index.separate_final_epoch = plan.separate_final_epoch;
  const std::int64_t epochs = plan.epochs, samples = plan.samples;

  // The document index: the split's ids tiled `epochs` times, shuffled (the last epoch apart).
  NumpyRandomState rng(config.random_seed);
  const auto docs = static_cast<std::size_t>(end - begin);
  NpyOutput<std::int32_t> documents(path_of(cache_base, "document_index"), {static_cast<std::size_t>(plan.documents)});
  const auto d = documents.data();
  for (std::size_t i = 0; i < docs; ++i) d[i] = static_cast<std::int32_t>(begin + static_cast<std::int64_t>(i));
  for (std::int64_t e = 1; e < epochs; ++e) std::copy_n(d.begin(), docs, d.begin() + static_cast<std::ptrdiff_t>(docs * static_cast<std::size_t>(e)));
  if (!plan.separate_final_epoch) {
    shuffle_like_numpy(d, rng);
  } else {
    const std::size_t head = docs * static_cast<std::size_t>(epochs - 1);
    shuffle_like_numpy(d.first(head), rng);
    shuffle_like_numpy(d.subspan(head), rng);
  }

  const std::int64_t first = plan.separate_final_epoch ? plan.samples_before_final : samples;
  const std::string shuffle_path = path_of(cache_base, "shuffle_index");
  auto shuffled = std::async(std::launch::async, [&, rng] {
    if (plan.shuffle_index_int64) return shuffle_index<std::int64_t>(first, samples, rng, shuffle_path);
    return shuffle_index<std::uint32_t>(first, samples, rng, shuffle_path);
  });
  const std::string sample_path = path_of(cache_base, "sample_index");
  if (plan.sample_index_int64) {
    index.sample_index = sample_index<std::int64_t>(lengths, d, config.sequence_length, samples, extra, sample_path);
  } else {
    index.sample_index = sample_index<std::int32_t>(lengths, d, config.sequence_length, samples, extra, sample_path);
  }
  index.document_index = documents.commit();
  index.shuffle_index = shuffled.get();
  return index;
}

}  // namespace detail

GptIndex build_gpt_index(std::span<const std::int32_t> lengths, std::int64_t begin, std::int64_t end,
                         std::optional<std::int64_t> num_samples, bool drop_last_partial,
                         const GptIndexConfig& config) {
  const Lengths view(reinterpret_cast<const std::uint8_t*>(lengths.data()), lengths.size());
  const auto plan = detail::plan_gpt_index(view, begin, end, num_samples, drop_last_partial, config, "the split");
  return detail::build_gpt_index_into(view, plan, begin, end, config, "");
}

}  // namespace dlm::data
