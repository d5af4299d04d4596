// Python's json.dumps(indent=4) over the values Megatron's dataset descriptions hold, byte for byte:
// the description's md5 names the cache files, so one differing byte means a cache miss.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dlm::data::detail {

struct PyValue;
using PyList = std::vector<PyValue>;
using PyDict = std::vector<std::pair<std::string, PyValue>>;  // insertion order, like OrderedDict

struct PyValue {
  std::variant<std::nullptr_t, bool, std::int64_t, double, std::string, PyList, PyDict> v;
  PyValue() : v(nullptr) {}
  PyValue(std::nullptr_t) : v(nullptr) {}
  PyValue(bool b) : v(b) {}
  PyValue(std::int64_t i) : v(i) {}
  PyValue(double d) : v(d) {}
  PyValue(std::string s) : v(std::move(s)) {}
  PyValue(const char* s) : v(std::string(s)) {}
  PyValue(PyList l) : v(std::move(l)) {}
  PyValue(PyDict d) : v(std::move(d)) {}
};

// repr(float): the shortest digits that round-trip; exponent form below 1e-4 and from 1e16.
std::string py_float_repr(double x);
// json.dumps(value, indent=4) (ensure_ascii, separators ", " / ": ").
std::string py_json_dumps(const PyValue& value);
// Parses a JSON text (e.g. a tokenizer's unique identifiers) keeping key order; throws dlm::Error
// naming `what` when it is not JSON.
PyValue py_json_parse(const std::string& text, const std::string& what);

}  // namespace dlm::data::detail
