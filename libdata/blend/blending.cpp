// Blend and split parsing, weight normalization, and helpers.cpp's blending indices.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

#include "blending.h"
#include "dlm/common/error.h"
#include "dlm/data/blend.h"

namespace dlm::data {

namespace {

// Python's float() on a word (no surrounding spaces): the whole word must be a number.
std::optional<double> python_float(const std::string& word) {
  if (word.empty()) return std::nullopt;
  std::string clean;
  for (char c : word)
    if (c != '_') clean += c;  // float() accepts digit-group underscores
  char* end = nullptr;
  const double v = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return v;
}

// numpy's pairwise summation (umath's pairwise_sum): blocks of 8 accumulators up to 128 values,
// halves (rounded to a multiple of 8) above.
double pairwise_sum(const double* a, std::size_t n) {
  if (n < 8) {
    double s = 0.;
    for (std::size_t i = 0; i < n; ++i) s += a[i];
    return s;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    std::size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + static_cast<std::size_t>(j)];
    double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) s += a[i];
    return s;
  }
  std::size_t half = n / 2;
  half -= half % 8;
  return pairwise_sum(a, half) + pairwise_sum(a + half, n - half);
}

Blend parse_blend_words(std::span<const std::string> arguments, const std::string& flag) {
  std::vector<std::string> words;
  for (const auto& arg : arguments) {
    std::istringstream in(arg);
    for (std::string w; in >> w;) words.push_back(w);
  }
  if (words.empty()) fail(flag + ": no datasets given");
  Blend blend;
  if (words.size() % 2 == 1) {
    if (python_float(words[0]))
      fail(flag + ": " + std::to_string(words.size()) + " words; expected weight/prefix pairs \"w1 p1 w2 p2\" or prefixes only");
    blend.prefixes = words;
    return blend;
  }
  std::vector<double> weights;
  std::size_t numbers = 0;
  for (std::size_t i = 0; i < words.size(); i += 2) numbers += python_float(words[i]).has_value();
  if (numbers == 0) {  // Megatron: no word parses as a weight, so all are prefixes
    blend.prefixes = words;
    return blend;
  }
  for (std::size_t i = 0; i < words.size(); i += 2) {
    const auto w = python_float(words[i]);
    if (!w) fail(flag + ": weight '" + words[i] + "' (word " + std::to_string(i + 1) + ") is not a number");
    if (!std::isfinite(*w) || *w <= 0)
      fail(flag + ": weight '" + words[i] + "' (word " + std::to_string(i + 1) + ") must be a finite number > 0");
    weights.push_back(*w);
    blend.prefixes.push_back(words[i + 1]);
  }
  blend.weights = std::move(weights);
  return blend;
}

}  // namespace

Blend parse_blend(std::span<const std::string> arguments, const std::string& flag) {
  Blend blend = parse_blend_words(arguments, flag);
  // megatron-core asserts len(datasets) < 32767: BlendedDataset's dataset_index is int16.
  if (blend.prefixes.size() >= 32767)
    fail(flag + ": " + std::to_string(blend.prefixes.size()) +
         " datasets; a blend holds at most 32766 (megatron-core's dataset_index is int16)");
  return blend;
}

std::vector<double> normalize_weights(std::span<const double> weights) {
  // numpy (2.x) add.reduce starts from the identity and pairwise-sums every element; starting from
  // the first element instead rounds differently for about a third of random weight vectors, and
  // one ulp of a weight moves ceil(size * w) by a sample.
  const double sum = pairwise_sum(weights.data(), weights.size());
  std::vector<double> out;
  for (double w : weights) out.push_back(w / sum);
  return out;
}

std::array<double, 3> parse_split(const std::string& split) {
  std::vector<double> parts;
  for (std::size_t i = 0; i < split.size();) {
    if (!(split[i] == '.' || (split[i] >= '0' && split[i] <= '9'))) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < split.size() && (split[j] == '.' || (split[j] >= '0' && split[j] <= '9'))) ++j;
    const std::string word = split.substr(i, j - i);
    const auto v = python_float(word);
    if (!v) fail("--split '" + split + "': '" + word + "' is not a number");
    parts.push_back(*v);
    i = j;
  }
  if (parts.size() > 3) fail("--split '" + split + "': " + std::to_string(parts.size()) + " parts, expected at most 3 (train,valid,test)");
  parts.resize(3, 0.0);
  const auto normalized = normalize_weights(parts);
  if (!(parts[0] + parts[1] + parts[2] > 0)) fail("--split '" + split + "': the parts sum to 0");
  return {normalized[0], normalized[1], normalized[2]};
}

SplitMatrix split_matrix(const std::array<double, 3>& v) {
  // convert_split_vector_to_split_matrix with one vector: book-ends of the running sums; a split
  // whose end is not past its start is empty.
  SplitMatrix m;
  double start = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const double end = start + v[i];
    if (end > start) m[i] = std::make_pair(start, end);
    start = end;
  }
  return m;
}

std::pair<std::int64_t, std::int64_t> split_range(const std::pair<double, double>& bookends, std::size_t n) {
  // int(round(x * float(n))): nearbyint rounds half to even, as Python's round does.
  const auto at = [&](double x) { return static_cast<std::int64_t>(std::nearbyint(x * static_cast<double>(n))); };
  return {at(bookends.first), at(bookends.second)};
}

namespace detail {

void fill_blending_indices(std::span<const double> weights, std::span<std::int16_t> dataset,
                           std::span<std::int64_t> sample) {
  std::vector<std::int64_t> taken(weights.size(), 0);
  for (std::size_t s = 0; s < dataset.size(); ++s) {
    const double x = std::max(static_cast<double>(s), 1.0);
    std::size_t best = 0;
    double best_error = weights[0] * x - static_cast<double>(taken[0]);
    for (std::size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * x - static_cast<double>(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset[s] = static_cast<std::int16_t>(best);
    sample[s] = taken[best]++;
  }
}

void fill_exhaustive_blending_indices(std::span<const std::int64_t> sizes, std::span<std::int16_t> dataset,
                                      std::span<std::int64_t> sample) {
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  std::vector<double> weights;
  for (auto s : sizes) weights.push_back(static_cast<double>(s) / static_cast<double>(total));
  std::vector<std::int64_t> taken(sizes.size(), 0);
  std::set<std::size_t> unspent;
  for (std::size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] > 0) unspent.insert(d);
  for (std::size_t s = 0; !unspent.empty(); ++s) {
    const double x = std::max(static_cast<double>(s), 1.0);
    std::size_t best = *unspent.begin();
    double best_error = std::numeric_limits<double>::lowest();
    for (auto d : unspent) {
      const double error = weights[d] * x - static_cast<double>(taken[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    dataset[s] = static_cast<std::int16_t>(best);
    sample[s] = taken[best]++;
    if (taken[best] == sizes[best]) unspent.erase(best);
  }
}

}  // namespace detail

BlendingIndices build_blending_indices(std::span<const double> weights, std::int64_t size) {
  std::vector<std::int16_t> dataset(static_cast<std::size_t>(size));
  std::vector<std::int64_t> sample(static_cast<std::size_t>(size));
  detail::fill_blending_indices(weights, dataset, sample);
  return {NpyArray::from_vector(std::move(dataset)), NpyArray::from_vector(std::move(sample))};
}

BlendingIndices build_exhaustive_blending_indices(std::span<const std::int64_t> sizes) {
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  std::vector<std::int16_t> dataset(static_cast<std::size_t>(total));
  std::vector<std::int64_t> sample(static_cast<std::size_t>(total));
  detail::fill_exhaustive_blending_indices(sizes, dataset, sample);
  return {NpyArray::from_vector(std::move(dataset)), NpyArray::from_vector(std::move(sample))};
}

}  // namespace dlm::data
