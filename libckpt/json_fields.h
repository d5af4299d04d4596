// Typed reads of JSON fields with one-line errors naming the file and the field (libckpt internal).
#pragma once

#include <cstdint>
#include <optional>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dlm/common/error.h"

namespace dlm::ckpt::detail {

using nlohmann::json;

inline json parse_json(std::string_view text, const std::string& file) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    fail_at_offset(file, e.byte > 0 ? e.byte - 1 : 0, "not valid JSON");
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    fail_at(file, fmt::format("not valid JSON ({})", e.what()));
  }
}

// Reads j[key] into `out` when present (and not null); a wrong type is an error naming `file` and `key`.
template <typename T>
bool read_field(const json& j, const char* key, T& out, const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  const bool ok = [&] {
    if constexpr (std::is_same_v<T, bool>) return it->is_boolean();
    else if constexpr (std::is_integral_v<T>) return it->is_number_integer();
    else if constexpr (std::is_floating_point_v<T>) return it->is_number();
    else return it->is_string();
  }();
  if (!ok) fail_at(file, fmt::format("field '{}': wrong type ({})", key, it->dump()));
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const auto v = it->get<std::int64_t>();
    if (v < static_cast<std::int64_t>(std::numeric_limits<T>::min()) || v > static_cast<std::int64_t>(std::numeric_limits<T>::max()))
      fail_at(file, fmt::format("field '{}': {} is out of range", key, v));
    out = static_cast<T>(v);
  } else {
    out = it->get<T>();
  }
  return true;
}

// Reads j[key], a list of integers, into `out` when present (and not null).
inline bool read_int_list(const json& j, const char* key, std::vector<int>& out, const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_array()) fail_at(file, fmt::format("field '{}': expected a list of integers ({})", key, it->dump()));
  out.clear();
  for (const json& v : *it) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > std::numeric_limits<int>::max())
      fail_at(file, fmt::format("field '{}': expected non-negative integers, got {}", key, v.dump()));
    out.push_back(v.get<int>());
  }
  return true;
}

template <typename T>
void read_optional(const json& j, const char* key, std::optional<T>& out, const std::string& file) {
  T v{};
  if (read_field(j, key, v, file)) out = v;
}

template <typename T>
T require_field(const json& j, const char* key, const std::string& file) {
  T v{};
  if (!read_field(j, key, v, file)) fail_at(file, fmt::format("missing field '{}'", key));
  return v;
}

}  // namespace dlm::ckpt::detail
