// Turning --input into a list of files.
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "dlm/common/error.h"
#include "dlm/data/jsonl.h"

namespace dlm::data {
namespace {

bool is_input_name(const std::string& name) {
  for (const char* ext : {".jsonl", ".json", ".zst"}) {
    std::string_view e(ext);
    if (name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

std::vector<std::string> folder_inputs(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_directory() && is_input_name(entry.path().filename().string())) files.push_back(entry.path().string());
  }
  if (ec) fail_at(dir, "cannot list folder: " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) fail_at(dir, "folder holds no .jsonl, .json or .zst file");
  return files;
}

std::vector<std::string> glob_inputs(const std::string& pattern) {
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0) files.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);  // glob() sorts by name
  ::globfree(&g);
  if (rc == GLOB_NOSPACE || rc == GLOB_ABORTED) fail_at(pattern, "cannot expand the glob");
  if (files.empty()) fail_at(pattern, "no file matches");
  return files;
}

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  if (patterns.empty()) fail("no --input given");
  std::vector<std::string> files;
  for (const auto& pattern : patterns) {
    struct stat st{};
    std::vector<std::string> more;
    if (pattern == "-") {
      more = {pattern};
    } else if (::stat(pattern.c_str(), &st) == 0) {
      more = S_ISDIR(st.st_mode) ? folder_inputs(pattern) : std::vector<std::string>{pattern};
    } else if (pattern.find_first_of("*?[") != std::string::npos) {
      more = glob_inputs(pattern);
    } else {
      fail_errno(pattern, "cannot open", errno);
    }
    files.insert(files.end(), more.begin(), more.end());
  }
  return files;
}

}  // namespace dlm::data
