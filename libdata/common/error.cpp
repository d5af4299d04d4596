#include "dlm/common/error.h"

#include <cstring>
#include <filesystem>
#include <new>

#include <fmt/format.h>

namespace dlm {
namespace {

std::string format_location(const Location& where, const std::string& message) {
  if (where.file.empty()) return message;
  std::string line = where.line != 0 ? fmt::format(":{}", where.line) : std::string();
  std::string offset = where.offset != Location::kNoOffset ? fmt::format(": offset {}", where.offset) : std::string();
  return fmt::format("{}{}{}: {}", where.file, line, offset, message);
}

}  // namespace

Error::Error(std::string message) : std::runtime_error(message), message_(std::move(message)) {}

Error::Error(Location where, std::string message)
    : std::runtime_error(format_location(where, message)),
      where_(std::move(where)),
      message_(std::move(message)) {}

void fail(std::string message) { throw Error(std::move(message)); }

std::string user_message(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return "out of memory; no output written";
  if (const auto* fs = dynamic_cast<const std::filesystem::filesystem_error*>(&e)) {
    const std::string path = fs->path1().empty() ? std::string() : fs->path1().string() + ": ";
    return path + fs->code().message();
  }
  return e.what();
}

void fail_at(const std::string& file, std::string message) {
  throw Error(Location{file}, std::move(message));
}

void fail_at_line(const std::string& file, std::uint64_t line, std::string message) {
  throw Error(Location{file, line}, std::move(message));
}

void fail_at_offset(const std::string& file, std::uint64_t offset, std::string message) {
  throw Error(Location{file, 0, offset}, std::move(message));
}

void fail_errno(const std::string& file, const std::string& what, int errno_value) {
  throw Error(Location{file}, what + ": " + std::strerror(errno_value));
}

}  // namespace dlm
