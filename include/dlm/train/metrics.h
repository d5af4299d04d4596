// Where training numbers go besides the log line: a JSONL file (one object per logged iteration) and
// TensorBoard event files.
//
// TensorBoard's format (tensorflow/core/util/events_writer, record_writer): a file
// "events.out.tfevents.<seconds>.<host>.<pid>" of records
//     uint64 length | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// (little endian; masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), each data an Event protobuf:
// wall_time (1, double), step (2, int64), file_version (3, "brain.Event:2", first record only) or
// summary (5) holding Value{tag (1), simple_value (2, float)}. Both files are appended and flushed at
// every write, so a killed run keeps everything it logged (they are logs, not atomic outputs).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>

namespace dlm::train {

// CRC-32C (Castagnoli), as TFRecord frames use it.
std::uint32_t crc32c(const void* data, std::size_t size);

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new event file inside it.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalars(std::int64_t step, const std::map<std::string, double>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write_record(std::string_view data);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Appends one JSON object per call: {"iteration": N, name: value, ...}.
class JsonlMetrics {
 public:
  explicit JsonlMetrics(const std::string& path);
  ~JsonlMetrics();
  JsonlMetrics(const JsonlMetrics&) = delete;
  JsonlMetrics& operator=(const JsonlMetrics&) = delete;
  void write(std::int64_t iteration, const std::map<std::string, double>& values);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace dlm::train
