#include "dlm/train/metrics.h"

#include <array>
#include <cmath>
#include <cstring>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <unistd.h>

#include <fmt/format.h>

#include "dlm/common/error.h"

namespace dlm::train {
namespace {

constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    t[i] = c;
  }
  return t;
}
constexpr auto kCrcTable = make_crc32c_table();

std::uint32_t masked_crc(std::string_view bytes) {
  const std::uint32_t c = crc32c(bytes.data(), bytes.size());
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Protobuf wire format, the few pieces an Event needs.
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
template <typename T>
void fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}
void length_delimited(std::string& out, int field, std::string_view bytes) {
  varint(out, static_cast<std::uint64_t>(field << 3 | 2));
  varint(out, bytes.size());
  out.append(bytes);
}
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
std::string event_header(double wall_time, std::int64_t step) {
  std::string e;
  e.push_back(0x09);  // wall_time: field 1, fixed64
  fixed(e, wall_time);
  e.push_back(0x10);  // step: field 2, varint
  varint(e, static_cast<std::uint64_t>(step));
  return e;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~0u;
  for (std::size_t i = 0; i < size; ++i) c = kCrcTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, std::int64_t max_queue) : max_queue_(max_queue) {
  if (max_queue < 1) fail(fmt::format("--tensorboard-queue-size: {} must be positive", max_queue));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail_at(dir, fmt::format("cannot create the TensorBoard folder: {}", ec.message()));
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const double t = now_seconds();
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}", dir, static_cast<std::int64_t>(t), host, getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) fail_errno(path_, "open", errno);
  std::string e = event_header(t, 0);
  length_delimited(e, 3, "brain.Event:2");
  write_record(e);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (!file_) return;
  try {
    flush();
  } catch (const std::exception&) {  // a destructor cannot report it; the events were a log
  }
  std::fclose(file_);
}

void TensorBoardWriter::add_scalars(std::int64_t step, const std::map<std::string, double>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    length_delimited(v, 1, tag);
    v.push_back(0x15);  // simple_value: field 2, fixed32
    fixed(v, static_cast<float>(value));
    length_delimited(summary, 1, v);
  }
  std::string e = event_header(now_seconds(), step);
  length_delimited(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(std::string_view data) {
  std::string frame;
  const std::uint64_t length = data.size();
  fixed(frame, length);
  const std::uint32_t length_crc = masked_crc(frame);
  fixed(frame, length_crc);
  frame.append(data);
  fixed(frame, masked_crc(data));
  queue_ += frame;
  if (++pending_ >= max_queue_) flush();
}

void TensorBoardWriter::flush() {
  if (queue_.empty()) return;
  if (std::fwrite(queue_.data(), 1, queue_.size(), file_) != queue_.size() || std::fflush(file_) != 0)
    fail_errno(path_, "write", errno);
  queue_.clear();
  pending_ = 0;
}

JsonlMetrics::JsonlMetrics(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "ab");
  if (!file_) fail_errno(path, "open", errno);
}

JsonlMetrics::~JsonlMetrics() {
  if (file_) std::fclose(file_);
}

void JsonlMetrics::write(std::int64_t iteration, const std::map<std::string, double>& values) {
  std::string line = fmt::format("{{\"iteration\": {}", iteration);
  for (const auto& [name, value] : values)
    line += std::isfinite(value) ? fmt::format(", \"{}\": {}", name, value) : fmt::format(", \"{}\": null", name);
  line += "}\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    fail_errno(path_, "write", errno);
}

}  // namespace dlm::train
