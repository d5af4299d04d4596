// Blocks of whole lines: a block is filled to about block_bytes, then cut after its last '\n'; the
// partial line after the cut starts the next block.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <simdjson.h>

#include "dlm/common/error.h"
#include "dlm/data/jsonl.h"

namespace dlm::data {

std::size_t json_padding() { return simdjson::SIMDJSON_PADDING; }

LineBlockReader::LineBlockReader(std::vector<std::string> files, std::size_t block_bytes, std::size_t max_line_bytes)
    : files_(std::move(files)),
      block_bytes_(std::max<std::size_t>(block_bytes, 64)),
      max_line_bytes_(std::max<std::size_t>(max_line_bytes, 1)) {}

LineBlockReader::~LineBlockReader() = default;

bool LineBlockReader::open_next() {
  if (source_) raw_done_ += source_->raw_bytes_read();
  source_.reset();
  if (file_index_ == files_.size()) return false;
  const std::string& path = files_[file_index_++];
  name_ = std::make_shared<const std::string>(path == "-" ? std::string("<stdin>") : path);
  source_ = ByteSource::open(path);
  next_line_ = 1;
  eof_ = false;
  carry_.clear();
  return true;
}

bool LineBlockReader::next(LineBlock& block) {
  const std::size_t padding = json_padding();
  for (;;) {
    if (!source_ || (eof_ && carry_.empty())) {
      if (!open_next()) return false;
    }
    block.file = name_;
    block.first_line = next_line_;
    block.bytes.resize(std::max(block_bytes_, carry_.size()) + padding);
    if (!carry_.empty()) std::memcpy(block.bytes.data(), carry_.data(), carry_.size());
    std::size_t used = carry_.size();
    carry_.clear();
    // Read until the block is full and holds a '\n', or the file ends.
    std::size_t scanned = 0;
    std::size_t cut = std::string::npos;
    for (;;) {
      if (cut == std::string::npos) {
        const char* nl = static_cast<const char*>(std::memchr(block.bytes.data() + scanned, '\n', used - scanned));
        scanned = used;
        if (nl != nullptr) cut = static_cast<std::size_t>(nl - block.bytes.data()) + 1;
      }
      if (eof_) break;
      if (used == block.bytes.size() - padding) {
        if (cut != std::string::npos) break;
        // One line longer than a block: the block holds nothing else, so it is line next_line_.
        const std::size_t most = max_line_bytes_ + 1;  // the line and its '\n'
        if (used >= most) {
          fail_at_line(*name_, next_line_,
                       fmt::format("a line longer than {} bytes: expected at most that much JSON per line", max_line_bytes_));
        }
        block.bytes.resize(std::min(used * 2, most) + padding);
      }
      std::size_t got = source_->read(block.bytes.data() + used, block.bytes.size() - padding - used);
      if (got == 0) eof_ = true;
      used += got;
    }
    if (eof_) {
      cut = used;  // the file's last line may lack its '\n'
    } else {
      const char* last = static_cast<const char*>(memrchr(block.bytes.data(), '\n', used));
      cut = static_cast<std::size_t>(last - block.bytes.data()) + 1;
    }
    carry_.assign(block.bytes.data() + cut, block.bytes.data() + used);
    block.used = cut;
    std::memset(block.bytes.data() + cut, ' ', std::min(padding, block.bytes.size() - cut));
    next_line_ += static_cast<std::uint64_t>(std::count(block.bytes.data(), block.bytes.data() + cut, '\n'));
    block.raw_position = raw_done_ + source_->raw_bytes_read();
    if (block.used > 0) return true;
  }
}

}  // namespace dlm::data
