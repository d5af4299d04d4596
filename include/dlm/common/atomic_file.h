// AtomicFile: writes a file so that an interrupted run never leaves one that looks complete.
//
// Bytes go to "<dir>/.<name>.tmp.<pid>.<n>"; commit() flushes, fsyncs, renames onto the final name and
// fsyncs the folder. Destroyed without commit() (an error, an exception), the temporary is removed. The
// temporary is flock()ed while open, so that remove_stale_temporaries() never takes a live writer's.
// A symlink at the final name is replaced, never written through. Permissions follow the umask.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dlm {

class AtomicFile {
 public:
  explicit AtomicFile(std::string final_path, std::size_t buffer_bytes = 1 << 20);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t size);
  void write(std::string_view text) { write(text.data(), text.size()); }
  template <typename T>
  void write_pod(const T& value) { write(&value, sizeof(T)); }
  template <typename T>
  void write_span(std::span<const T> values) { write(values.data(), values.size_bytes()); }

  // Bytes written so far.
  std::uint64_t size() const noexcept { return written_; }
  const std::string& path() const noexcept { return final_path_; }
  const std::string& temp_path() const noexcept { return temp_path_; }

  // Flush, fsync, rename over the final path, fsync the folder. Throws dlm::Error on any failure
  // (a full disk included) and then leaves no file behind.
  void commit();
  // Remove the temporary now (also done by the destructor when not committed).
  void abandon() noexcept;

 private:
  void flush();
  std::string final_path_;
  std::string temp_path_;
  int fd_ = -1;
  std::vector<char> buffer_;
  std::size_t buffered_ = 0;
  std::uint64_t written_ = 0;
  bool committed_ = false;
};

// Writes a whole file atomically in one call.
void write_file_atomically(const std::string& path, std::string_view contents);
// Removes the temporaries ".NAME.tmp.PID.N" in `folder` (files only, not sub-folders) whose PID is not a
// live process on this machine and that no writer holds locked (AtomicFile holds an flock on its
// temporary, so a writer on another machine sharing the folder keeps its own): what a SIGKILLed run left
// behind. A tool calls it once on its output folder before writing. Returns how many were removed; errors
// are ignored (a temporary that cannot be removed is left).
std::size_t remove_stale_temporaries(const std::string& folder);
// fsync of a folder, so that a rename inside it is durable.
void fsync_directory(const std::string& dir);
// Reads a whole (small) file; throws dlm::Error naming it.
std::string read_text_file(const std::string& path);

}  // namespace dlm
