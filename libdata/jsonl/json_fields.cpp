// One JSON line through simdjson's on-demand parser. Values of keys not asked for are still walked to
// the end (every string unescaped, every number parsed), because on-demand skipping alone would accept
// malformed JSON there that Python's json.loads (Megatron's reader) rejects.
#include <new>
#include <string>

#include <fmt/format.h>
#include <simdjson.h>

#include "dlm/data/jsonl.h"

namespace dlm::data {

namespace od = simdjson::ondemand;

struct JsonFieldReader::Impl {
  od::parser parser;
};

namespace {

const char* type_name(od::json_type t) {
  switch (t) {
    case od::json_type::array: return "an array";
    case od::json_type::object: return "an object";
    case od::json_type::number: return "a number";
    case od::json_type::string: return "a string";
    case od::json_type::boolean: return "a boolean";
    case od::json_type::null: return "null";
  }
  return "a value";
}

std::string json_error(simdjson::error_code e) {
  // Not the line's fault: --skip-invalid must not skip it, and the tool reports running out of memory.
  if (e == simdjson::MEMALLOC) throw std::bad_alloc();
  if (e == simdjson::UTF8_ERROR) return "invalid UTF-8: expected UTF-8 text";
  if (e == simdjson::EMPTY) return "expected a JSON object, found an empty line";
  return fmt::format("invalid JSON: {}", simdjson::error_message(e));
}

// Walks a value to its end, reporting the first malformed part.
simdjson::error_code walk(od::value v, int depth) {
  if (depth > 1024) return simdjson::DEPTH_ERROR;
  od::json_type type;
  if (auto e = v.type().get(type)) return e;
  switch (type) {
    case od::json_type::object: {
      od::object obj;
      if (auto e = v.get_object().get(obj)) return e;
      for (auto field : obj) {
        std::string_view key;
        if (auto e = field.unescaped_key().get(key)) return e;
        od::value value;
        if (auto e = field.value().get(value)) return e;
        if (auto e = walk(value, depth + 1)) return e;
      }
      return simdjson::SUCCESS;
    }
    case od::json_type::array: {
      od::array arr;
      if (auto e = v.get_array().get(arr)) return e;
      for (auto item : arr) {
        od::value element;
        if (auto e = item.get(element)) return e;
        if (auto e = walk(element, depth + 1)) return e;
      }
      return simdjson::SUCCESS;
    }
    case od::json_type::string: return v.get_string().error();
    case od::json_type::number: return v.get_number().error();
    case od::json_type::boolean: return v.get_bool().error();
    case od::json_type::null: {
      bool null = false;
      if (auto e = v.is_null().get(null)) return e;
      return null ? simdjson::SUCCESS : simdjson::N_ATOM_ERROR;
    }
  }
  return simdjson::INCORRECT_TYPE;
}

}  // namespace

JsonFieldReader::JsonFieldReader(std::vector<std::string> keys)
    : impl_(std::make_unique<Impl>()), keys_(std::move(keys)), fields_(keys_.size()) {}

JsonFieldReader::~JsonFieldReader() = default;

std::string JsonFieldReader::read(const char* line, std::size_t size) {
  std::vector<bool> seen(keys_.size(), false);
  for (auto& f : fields_) f.parts.clear();
  od::document doc;
  if (auto e = impl_->parser.iterate(line, size, size + simdjson::SIMDJSON_PADDING).get(doc)) return json_error(e);
  od::json_type top;
  if (auto e = doc.type().get(top)) return json_error(e);
  if (top != od::json_type::object) return fmt::format("expected a JSON object, found {}", type_name(top));
  od::object obj;
  if (auto e = doc.get_object().get(obj)) return json_error(e);
  for (auto field : obj) {
    std::string_view key;
    if (auto e = field.unescaped_key().get(key)) return json_error(e);
    od::value value;
    if (auto e = field.value().get(value)) return json_error(e);
    std::size_t k = 0;
    while (k < keys_.size() && keys_[k] != key) ++k;
    if (k == keys_.size()) {
      if (auto e = walk(value, 1)) return json_error(e);
      continue;
    }
    Field& out = fields_[k];
    out.parts.clear();
    seen[k] = true;
    od::json_type type;
    if (auto e = value.type().get(type)) return json_error(e);
    if (type == od::json_type::string) {
      out.is_array = false;
      std::string_view text;
      if (auto e = value.get_string().get(text)) return json_error(e);
      out.parts.push_back(text);
    } else if (type == od::json_type::array) {
      out.is_array = true;
      od::array arr;
      if (auto e = value.get_array().get(arr)) return json_error(e);
      for (auto item : arr) {
        od::value element;
        if (auto e = item.get(element)) return json_error(e);
        od::json_type et;
        if (auto e = element.type().get(et)) return json_error(e);
        if (et != od::json_type::string) {
          return fmt::format("key \"{}\": expected a string or an array of strings, found an array holding {}", key,
                             type_name(et));
        }
        std::string_view text;
        if (auto e = element.get_string().get(text)) return json_error(e);
        out.parts.push_back(text);
      }
    } else {
      return fmt::format("key \"{}\": expected a string or an array of strings, found {}", key, type_name(type));
    }
  }
  // The document is at its end exactly when no token is left.
  if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS) return "invalid JSON: expected the line to end after its object";
  for (std::size_t k = 0; k < keys_.size(); ++k) {
    if (!seen[k]) return fmt::format("missing key \"{}\": expected it in every JSON object", keys_[k]);
  }
  return {};
}

}  // namespace dlm::data
