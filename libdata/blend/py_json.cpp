// Python-compatible JSON output for Megatron's dataset descriptions.
#include "py_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dlm/common/error.h"

namespace dlm::data::detail {

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "NaN";  // json.dumps spells the non-finite values this way
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // "-d.ddde+XX"
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const auto e = sci.find('e');
  const int exp10 = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exp10 < -4 || exp10 >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exp10 < 0 ? "e-" : "e+";
    const int a = std::abs(exp10);
    out += (a < 10 ? "0" : "") + std::to_string(a);
  } else if (exp10 < 0) {
    out = "0." + std::string(static_cast<std::size_t>(-exp10 - 1), '0') + digits;
  } else {
    const auto point = static_cast<std::size_t>(exp10) + 1;
    if (digits.size() <= point) {
      out = digits + std::string(point - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, point) + "." + digits.substr(point);
    }
  }
  return negative ? "-" + out : out;
}

namespace {

void dump_string(const std::string& s, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto unicode_escape = [&](std::uint32_t u) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(u >> shift) & 15];
  };
  out += '"';
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || c == 0x7f) {  // Python escapes everything outside ' '..'~'
      unicode_escape(c);
      continue;
    }
    if (c < 0x80) {
      out += static_cast<char>(c);
      continue;
    }
    // ensure_ascii: decode UTF-8 and write \uXXXX (a surrogate pair above the BMP).
    int extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1;
    std::uint32_t u = c & (0x3f >> extra);
    for (int k = 0; k < extra && i + 1 < s.size(); ++k) u = (u << 6) | (static_cast<unsigned char>(s[++i]) & 0x3f);
    if (u >= 0x10000) {
      u -= 0x10000;
      unicode_escape(0xd800 + (u >> 10));
      unicode_escape(0xdc00 + (u & 0x3ff));
    } else {
      unicode_escape(u);
    }
  }
  out += '"';
}

void dump(const PyValue& value, int level, std::string& out) {
  const std::string inner(static_cast<std::size_t>(4 * (level + 1)), ' ');
  const std::string outer(static_cast<std::size_t>(4 * level), ' ');
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::nullptr_t>) out += "null";
        else if constexpr (std::is_same_v<T, bool>) out += x ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::int64_t>) out += std::to_string(x);
        else if constexpr (std::is_same_v<T, double>) out += py_float_repr(x);
        else if constexpr (std::is_same_v<T, std::string>) dump_string(x, out);
        else if constexpr (std::is_same_v<T, PyList>) {
          if (x.empty()) { out += "[]"; return; }
          out += "[\n";
          for (std::size_t i = 0; i < x.size(); ++i) {
            out += inner;
            dump(x[i], level + 1, out);
            out += i + 1 < x.size() ? ",\n" : "\n";
          }
          out += outer + "]";
        } else {
          if (x.empty()) { out += "{}"; return; }
          out += "{\n";
          for (std::size_t i = 0; i < x.size(); ++i) {
            out += inner;
            dump_string(x[i].first, out);
            out += ": ";
            dump(x[i].second, level + 1, out);
            out += i + 1 < x.size() ? ",\n" : "\n";
          }
          out += outer + "}";
        }
      },
      value.v);
}

PyValue from_json(const nlohmann::ordered_json& j) {
  if (j.is_null()) return nullptr;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<std::int64_t>();
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) return j.get<std::string>();
  if (j.is_array()) {
    PyList l;
    for (const auto& e : j) l.push_back(from_json(e));
    return l;
  }
  PyDict d;
  for (const auto& [k, e] : j.items()) d.emplace_back(k, from_json(e));
  return d;
}

}  // namespace

std::string py_json_dumps(const PyValue& value) {
  std::string out;
  dump(value, 0, out);
  return out;
}

PyValue py_json_parse(const std::string& text, const std::string& what) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    fail(what + ": not JSON (" + e.what() + ")");
  }
  return from_json(j);
}

}  // namespace dlm::data::detail
