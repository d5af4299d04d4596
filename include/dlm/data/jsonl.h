// JSONL input: files, globs, folders and stdin, plain or zstd-compressed, read as blocks of whole lines,
// and the fields of one JSON line pulled out with simdjson's on-demand parser.
//
// Lines end at '\n' (a '\r' before it is JSON whitespace). Every error names the file and the 1-based
// line: "FILE:LINE: what was expected".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dlm::data {

// The files an --input names: "-" (stdin), a file, a folder (its *.jsonl, *.json, *.zst files, sorted by
// name, not recursive) or a glob (matches sorted by name). Throws dlm::Error when nothing matches.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

// A stream of decompressed bytes: a plain file, a .zst file (zstd's streaming API; several frames are
// read one after the other), or stdin ("-", which may itself be zstd: its magic number decides).
class ByteSource {
 public:
  static std::unique_ptr<ByteSource> open(const std::string& path);
  virtual ~ByteSource() = default;
  // Up to n bytes; 0 only at the end. Throws dlm::Error on a read error or a truncated/corrupt .zst.
  virtual std::size_t read(char* out, std::size_t n) = 0;
  // Bytes consumed from the file itself (compressed bytes for .zst), for progress against its size.
  virtual std::uint64_t raw_bytes_read() const noexcept = 0;
  const std::string& path() const noexcept { return path_; }

 protected:
  explicit ByteSource(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Bytes that must stay readable after a line for simdjson (its SIMDJSON_PADDING).
std::size_t json_padding();

// Whole lines of one file, `bytes` holding them back to back (each with its '\n' except maybe the file's
// last), followed by json_padding() readable bytes.
struct LineBlock {
  std::shared_ptr<const std::string> file;
  std::uint64_t first_line = 1;          // line number of the first line, 1-based
  std::vector<char> bytes;               // size() = used + json_padding()
  std::size_t used = 0;
  std::uint64_t raw_position = 0;        // across all inputs, for progress
};

// The longest line read as one JSON document: simdjson's largest (4 GiB - 1 bytes, its '\n' not counted).
inline constexpr std::size_t kMaxLineBytes = 0xFFFFFFFF;

// Reads the inputs in order as blocks of about `block_bytes` (a single longer line makes a longer block).
// A line longer than `max_line_bytes` is an error naming FILE:LINE, raised before more of it is read,
// so a file without newlines cannot take all memory.
class LineBlockReader {
 public:
  LineBlockReader(std::vector<std::string> files, std::size_t block_bytes, std::size_t max_line_bytes = kMaxLineBytes);
  ~LineBlockReader();
  // Fills `block` with the next lines; false when every input is done. Throws dlm::Error.
  bool next(LineBlock& block);

 private:
  bool open_next();
  std::vector<std::string> files_;
  std::size_t block_bytes_;
  std::size_t max_line_bytes_;
  std::size_t file_index_ = 0;
  std::unique_ptr<ByteSource> source_;
  std::shared_ptr<const std::string> name_;
  std::uint64_t next_line_ = 1;
  std::uint64_t raw_done_ = 0;  // raw bytes of finished files
  std::vector<char> carry_;     // a partial line read past the last block's end
  bool eof_ = false;
};

// The values of the requested keys in one JSON object line. A value is a string, or an array of strings
// (Megatron's sentence-split layout: one string per sentence). A duplicated key takes its last value, as
// Python's json.loads does.
class JsonFieldReader {
 public:
  explicit JsonFieldReader(std::vector<std::string> keys);
  ~JsonFieldReader();
  JsonFieldReader(const JsonFieldReader&) = delete;
  JsonFieldReader& operator=(const JsonFieldReader&) = delete;

  struct Field {
    bool is_array = false;
    std::vector<std::string_view> parts;  // one part for a string; views valid until the next read()
  };

  // Parses `line` (json_padding() bytes readable after it). Returns "" and fills fields()[k] for every
  // key, or a message saying what was expected (no location: the caller knows the file and line).
  std::string read(const char* line, std::size_t size);
  const std::vector<Field>& fields() const noexcept { return fields_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> keys_;
  std::vector<Field> fields_;
};

}  // namespace dlm::data
