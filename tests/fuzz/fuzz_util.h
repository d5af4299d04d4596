// Helpers shared by the libFuzzer targets: inputs split on NUL bytes into parts, and parts written to
// per-process temporary files for parsers that take a path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace dlm::fuzz {

// Splits on '\0' into at most `max_parts` parts (the last one keeps any further NULs).
inline std::vector<std::string> split_parts(const std::uint8_t* data, std::size_t size, std::size_t max_parts) {
  std::vector<std::string> parts;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (parts.size() + 1 < max_parts) {
    const auto cut = rest.find('\0');
    if (cut == std::string_view::npos) break;
    parts.emplace_back(rest.substr(0, cut));
    rest.remove_prefix(cut + 1);
  }
  parts.emplace_back(rest);
  return parts;
}

// A fixed path in the temp folder, unique to this process, named `name`.
inline std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("dlm_fuzz_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

inline std::string write_temp(const std::string& name, std::string_view bytes) {
  const auto path = temp_path(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace dlm::fuzz
