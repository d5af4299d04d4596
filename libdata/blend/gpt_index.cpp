// GPTDataset's document, sample and shuffle indices (gpt_dataset.py and helpers.cpp's
// build_sample_idx), reproduced exactly.
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "dlm/common/error.h"
#include "dlm/data/gpt_dataset.h"
#include "fast_shuffle.h"

namespace dlm::data {

const char* split_name(Split split) {
  switch (split) {
    case Split::kTrain: return "train";
    case Split::kValid: return "valid";
    case Split::kTest: return "test";
  }
  return "?";
}

namespace {

// The document index, each entry carrying its sequence's length in the high word so that the
// sample index is built by a sequential scan instead of a random lookup per document.
// Megatron tiles [begin, end) `epochs` times and shuffles; shuffling (id, length) pairs moves the
// ids exactly as shuffling the ids alone would.
std::vector<std::uint64_t> tiled_documents(std::span<const std::int32_t> lengths, std::int64_t begin,
                                           std::int64_t end, std::int64_t epochs) {
  const auto docs = static_cast<std::size_t>(end - begin);
  std::vector<std::uint64_t> out(docs * static_cast<std::size_t>(epochs));
  for (std::size_t d = 0; d < docs; ++d) {
    const auto id = static_cast<std::uint32_t>(begin + static_cast<std::int64_t>(d));
    out[d] = (std::uint64_t{static_cast<std::uint32_t>(lengths[id])} << 32) | id;
  }
  for (std::int64_t e = 1; e < epochs; ++e)
    std::copy(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(docs),
              out.begin() + static_cast<std::ptrdiff_t>(docs * static_cast<std::size_t>(e)));
  return out;
}

// helpers.cpp build_sample_idx: walk the document index, cutting a sample every L tokens; each
// sample spans L + extra tokens, so the next one starts `extra` tokens before this one ends.
template <typename T>
std::vector<T> sample_index(std::span<const std::uint64_t> documents, std::int32_t seq_length,
                            std::int64_t num_samples, std::int32_t extra) {
  std::vector<T> out(2 * static_cast<std::size_t>(num_samples + 1));
  T doc = 0, offset = 0;
  const T last = static_cast<T>(documents.size()) - 1;
  auto length_of = [&](T position) { return static_cast<std::int32_t>(documents[static_cast<std::size_t>(position)] >> 32); };
  out[0] = 0;
  out[1] = 0;
  for (std::int64_t s = 1; s <= num_samples; ++s) {
    std::int32_t remaining = seq_length + extra;
    while (remaining != 0) {
      const auto doc_length = static_cast<std::int32_t>(length_of(doc) - offset);
      remaining -= doc_length;
      if (remaining <= 0) {
        offset += static_cast<T>(remaining + doc_length - extra);
        remaining = 0;
      } else if (doc == last) {
        // The data ran out: only the final sample (drop_last_partial off) ends here.
        offset = static_cast<T>(length_of(doc) - extra);
        break;
      } else {
        ++doc;
        offset = 0;
      }
    }
    out[2 * static_cast<std::size_t>(s)] = doc;
    out[2 * static_cast<std::size_t>(s) + 1] = offset;
  }
  return out;
}

template <typename T>
NpyArray shuffle_index(std::int64_t first_range, std::int64_t total, NumpyRandomState& rng) {
  std::vector<T> out(static_cast<std::size_t>(total));
  std::iota(out.begin(), out.end(), T{0});
  const auto first = static_cast<std::size_t>(first_range);
  detail::shuffle_like_numpy(std::span<T>(out.data(), first), rng);
  if (first_range != total) detail::shuffle_like_numpy(std::span<T>(out.data() + first, out.size() - first), rng);
  return NpyArray::from_vector(std::move(out));
}

}  // namespace

GptIndex build_gpt_index(std::span<const std::int32_t> lengths, std::int64_t begin, std::int64_t end,
                         std::optional<std::int64_t> num_samples, bool drop_last_partial,
                         const GptIndexConfig& config) {
  const std::int64_t L = config.sequence_length;
  const std::int32_t extra = config.add_extra_token_to_sequence ? 1 : 0;
  if (L <= 1) fail("sequence length " + std::to_string(L) + " must be at least 2");
  if (begin < 0 || end > static_cast<std::int64_t>(lengths.size()) || begin >= end)
    fail("document range [" + std::to_string(begin) + ", " + std::to_string(end) + ") is empty or outside the " +
         std::to_string(lengths.size()) + " sequences");

  GptIndex index;
  std::int64_t tokens = 0;
  for (std::int64_t i = begin; i < end; ++i) tokens += lengths[static_cast<std::size_t>(i)];
  if (tokens <= 1) fail("the split holds " + std::to_string(tokens) + " tokens; a sample needs at least 2");
  index.tokens_per_epoch = tokens;

  // Epochs: the least E with E * tokens >= num_samples * L + extra.
  std::int64_t epochs = 1;
  if (num_samples) {
    const std::int64_t wanted = *num_samples * L + extra;
    epochs = std::max<std::int64_t>(1, (wanted + tokens - 1) / tokens);
  }
  index.num_epochs = epochs;

  std::int64_t samples_before_final = 0;
  if (epochs > 1) {
    samples_before_final = ((epochs - 1) * tokens - extra) / L;
    const std::int64_t from_final = *num_samples - samples_before_final;
    const std::int64_t per_epoch = (tokens - extra) / L;
    index.separate_final_epoch = from_final < static_cast<std::int64_t>(0.80 * static_cast<double>(per_epoch));
  }

  NumpyRandomState rng(config.random_seed);
  const auto docs = static_cast<std::size_t>(end - begin);
  std::vector<std::uint64_t> documents;
  if (!index.separate_final_epoch) {
    documents = tiled_documents(lengths, begin, end, epochs);
    detail::shuffle_like_numpy(std::span<std::uint64_t>(documents), rng);
  } else {
    documents = tiled_documents(lengths, begin, end, epochs);
    const std::size_t head = docs * static_cast<std::size_t>(epochs - 1);
    detail::shuffle_like_numpy(std::span<std::uint64_t>(documents.data(), head), rng);
    detail::shuffle_like_numpy(std::span<std::uint64_t>(documents.data() + head, docs), rng);
  }

  std::int64_t samples;
  if (drop_last_partial) {
    samples = (epochs * tokens - extra) / L;
  } else {
    // helpers.cpp computes this in single precision.
    samples = static_cast<std::int64_t>(std::ceil(static_cast<float>(epochs * tokens - extra) / static_cast<float>(L)));
  }
  const bool wide = documents.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());
  if (wide) {
    index.sample_index = NpyArray::from_vector(sample_index<std::int64_t>(documents, config.sequence_length, samples, extra),
                                               {static_cast<std::size_t>(samples + 1), 2});
  } else {
    index.sample_index = NpyArray::from_vector(sample_index<std::int32_t>(documents, config.sequence_length, samples, extra),
                                               {static_cast<std::size_t>(samples + 1), 2});
  }
  {
    std::vector<std::int32_t> ids(documents.size());
    for (std::size_t p = 0; p < documents.size(); ++p) ids[p] = static_cast<std::int32_t>(documents[p] & 0xffffffffu);
    std::vector<std::uint64_t>().swap(documents);
    index.document_index = NpyArray::from_vector(std::move(ids));
  }

  const std::int64_t first = index.separate_final_epoch ? samples_before_final : samples;
  if (samples >= static_cast<std::int64_t>(std::numeric_limits<std::uint32_t>::max()) - 1) {
    index.shuffle_index = shuffle_index<std::int64_t>(first, samples, rng);
  } else {
    index.shuffle_index = shuffle_index<std::uint32_t>(first, samples, rng);
  }
  return index;
}

}  // namespace dlm::data
