// Checks every tool applies to its flags, so that a bad value is a usage error (exit 2) naming the flag
// instead of a wrapped count, a NaN carried into arithmetic, or an empty path found late.
//
// checked() looks at the parsed strings, before Boost.PO converts them: Boost.PO reads "-1" into an
// unsigned option as 2^64-1 (or 2^32-1) without a word, and "nan" into a double. So, for every option:
//   - an unsigned one refuses a negative value;
//   - a floating-point one refuses NaN and infinities;
//   - any value refuses the empty string (no flag gives "" a meaning).
// Ranges that depend on the flag (at least 1, at most a limit) are in_range() calls beside the parse.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <fmt/format.h>

namespace dlm::tools {

namespace flag_checks_detail {

namespace po = boost::program_options;

template <typename... T>
bool holds_any(const po::value_semantic* s) {
  return ((dynamic_cast<const po::typed_value<T>*>(s) != nullptr) || ...);
}

inline bool unsigned_option(const po::value_semantic* s) {
  return holds_any<unsigned char, unsigned short, unsigned int, unsigned long, unsigned long long,
                   std::vector<unsigned int>, std::vector<unsigned long>, std::vector<unsigned long long>>(s);
}

inline bool floating_option(const po::value_semantic* s) {
  return holds_any<float, double, long double, std::vector<float>, std::vector<double>>(s);
}

inline std::string trimmed(const std::string& v) {
  const auto b = v.find_first_not_of(" \t");
  return b == std::string::npos ? std::string() : v.substr(b, v.find_last_not_of(" \t") - b + 1);
}

}  // namespace flag_checks_detail

// The parsed command line, after the checks above; throws po::error naming the flag.
inline boost::program_options::parsed_options checked(boost::program_options::parsed_options parsed) {
  namespace po = boost::program_options;
  using namespace flag_checks_detail;
  if (parsed.description == nullptr) return parsed;
  for (const auto& option : parsed.options) {
    if (option.unregistered || option.string_key.empty()) continue;
    const po::option_description* d = parsed.description->find_nothrow(option.string_key, false);
    if (d == nullptr) continue;
    const po::value_semantic* s = d->semantic().get();
    const std::string name = "--" + d->long_name();
    for (const auto& raw : option.value) {
      const std::string v = trimmed(raw);
      if (v.empty() && s->max_tokens() > 0) throw po::error(name + ": empty value");
      if (unsigned_option(s) && v.starts_with("-"))
        throw po::error(fmt::format("{} {}: expected a count >= 0", name, raw));
      if (floating_option(s)) {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (end != v.c_str() && !std::isfinite(x)) throw po::error(fmt::format("{} {}: expected a finite number", name, raw));
      }
    }
  }
  return parsed;
}

// Throws po::error "--NAME V: expected LO to HI" when value is outside [lo, hi].
template <typename T, typename L, typename H>
void in_range(const char* name, T value, L lo, H hi) {
  if (!(value >= static_cast<T>(lo) && value <= static_cast<T>(hi)))
    throw boost::program_options::error(fmt::format("--{} {}: expected {} to {}", name, value, lo, hi));
}

// Throws po::error "--NAME V: expected a value > 0" unless value > 0 (and, for floats, finite).
template <typename T>
void positive(const char* name, T value) {
  if (!(value > T(0)) || (std::is_floating_point_v<T> && !std::isfinite(static_cast<double>(value))))
    throw boost::program_options::error(fmt::format("--{} {}: expected a value > 0", name, value));
}

}  // namespace dlm::tools
