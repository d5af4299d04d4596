// dlm::Error: the one error type every dlm library throws.
//
// An error says where it happened in the user's terms: the file, and the line (text inputs) or the
// byte offset (binary inputs) that went wrong, then what was expected. Its what() is the one-line
// message the tools print: "FILE:LINE: message" or "FILE: offset N: message".
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace dlm {

struct Location {
  std::string file;                 // empty when the error is not about a file
  std::uint64_t line = 0;           // 1-based; 0 when unknown
  std::uint64_t offset = kNoOffset; // byte offset; kNoOffset when unknown
  static constexpr std::uint64_t kNoOffset = ~std::uint64_t{0};
};

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message);
  Error(Location where, std::string message);

  const Location& where() const noexcept { return where_; }
  // The message without the location prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  Location where_;
  std::string message_;
};

// Shorthands that keep call sites on one line.
[[noreturn]] void fail(std::string message);
[[noreturn]] void fail_at(const std::string& file, std::string message);
[[noreturn]] void fail_at_line(const std::string& file, std::uint64_t line, std::string message);
[[noreturn]] void fail_at_offset(const std::string& file, std::uint64_t offset, std::string message);
// The one line a tool prints for any exception that reaches its main: dlm::Error's what(); "out of memory"
// for std::bad_alloc (never "std::bad_alloc"); "PATH: reason" for a std::filesystem error; what() else.
std::string user_message(const std::exception& e);
// An OS call failed: the message ends with strerror(errno_value).
[[noreturn]] void fail_errno(const std::string& file, const std::string& what, int errno_value);

}  // namespace dlm
