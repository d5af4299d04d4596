// Where training numbers go besides the log line: a JSONL file (one object per logged iteration) and
// TensorBoard event files.
//
// TensorBoard's format (tensorflow/core/util/events_writer, record_writer): a file
// "events.out.tfevents.<seconds>.<host>.<pid>" of records
//     uint64 length | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// (little endian; masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), each data an Event protobuf:
// wall_time (1, double), step (2, int64), file_version (3, "brain.Event:2", first record only) or
// summary (5) holding Value{tag (1), simple_value (2, float)}. The JSONL file is flushed at every write; the
// event file holds up to `max_queue` events (Megatron's --tensorboard-queue-size) before it writes them, and the
// trainer flushes it at every log line, so a killed run loses at most the events since its last log line (they are
// logs, not atomic outputs).
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
  // Creates `dir` if needed and a new event file inside it; events are written once `max_queue` (>= 1) are pending.
  explicit TensorBoardWriter(const std::string& dir, std::int64_t max_queue = 1);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalars(std::int64_t step, const std::map<std::string, double>& scalars);
  // Writes the pending events (also done by the destructor).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(std::string_view data);
  std::string path_;
  std::FILE* file_ = nullptr;
  std::int64_t max_queue_;
  std::int64_t pending_ = 0;
  std::string queue_;  // framed records not yet written
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
