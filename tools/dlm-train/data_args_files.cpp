#include "data_args_files.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dlm/common/error.h"

namespace dlm::tools {
namespace {

std::string read_text(const std::string& path, const char* flag, const char* expected) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(fmt::format("{}: cannot open ({} names it; expected {})", path, flag, expected));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) fail(fmt::format("{}: read error ({})", path, flag));
  return s.str();
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream s(text);
  std::vector<std::string> out;
  for (std::string w; s >> w;) out.push_back(w);
  return out;
}

constexpr const char* kPerSplitExpected =
    R"(a JSON object {"train": ..., "valid": ..., "test": ...}, each a string or a list of [weight] prefix words, or null)";

}  // namespace

std::vector<std::string> read_data_args(const std::string& path) {
  const char* expected = "the --data-path words: [weight] prefix ...";
  std::vector<std::string> out = words(read_text(path, "--data-args-path", expected));
  if (out.empty()) fail(fmt::format("{}: empty; expected {} (--data-args-path)", path, expected));
  return out;
}

std::array<std::vector<std::string>, 3> read_per_split_data_args(const std::string& path) {
  const std::string text = read_text(path, "--per-split-data-args-path", kPerSplitExpected);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(fmt::format("{}: offset {}: not JSON; expected {} (--per-split-data-args-path)", path, e.byte, kPerSplitExpected));
  }
  if (!j.is_object()) fail(fmt::format("{}: expected {} (--per-split-data-args-path)", path, kPerSplitExpected));
  std::array<std::vector<std::string>, 3> out;
  const char* keys[] = {"train", "valid", "test"};
  for (int i = 0; i < 3; ++i) {
    const auto at = j.find(keys[i]);
    if (at == j.end())
      fail(fmt::format("{}: no \"{}\" key; expected {} (--per-split-data-args-path)", path, keys[i], kPerSplitExpected));
    if (at->is_null()) continue;
    if (at->is_string()) {
      out[i] = words(at->get<std::string>());
      continue;
    }
    if (!at->is_array())
      fail(fmt::format("{}: \"{}\" is {}; expected a string, a list of words or null (--per-split-data-args-path)", path,
                       keys[i], at->type_name()));
    for (const auto& w : *at) {
      // Megatron's get_blend_from_list takes float(weight): a JSON number is a weight as well as its string.
      if (w.is_string()) out[i].push_back(w.get<std::string>());
      else if (w.is_number()) out[i].push_back(w.dump());
      else
        fail(fmt::format("{}: \"{}\" holds {}; expected [weight] prefix words (--per-split-data-args-path)", path,
                         keys[i], w.dump()));
    }
  }
  return out;
}

}  // namespace dlm::tools
