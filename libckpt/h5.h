// Thin RAII over the HDF5 C API for the checkpoint store (libckpt internal). Every failure becomes a
// dlm::Error naming the file and the dataset; HDF5's own error printing is switched off.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dlm/ckpt/sharding.h"

namespace dlm::ckpt::detail {

class H5Handle {
 public:
  H5Handle() = default;
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Handle() { reset(); }
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  hid_t get() const { return id_; }
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// A hyperslab: a Box (sharding.h) of the dataset.
using Slab = Box;

class H5File {
 public:
  // Truncates. Objects of 4 KiB and more are aligned to 4 KiB in the file (so O_DIRECT can write them).
  static H5File create(const std::string& path);
  static H5File open_read(const std::string& path);
  const std::string& path() const { return path_; }
  hid_t id() const { return file_.get(); }

  // Writes an fp32 dataset "/group/name" of `shape` from `data` (contiguous layout).
  void write_f32(const std::string& group, const std::string& name, const std::vector<std::int64_t>& shape, const float* data);
  // Creates "/group/name" with its contiguous storage allocated now and never filled by HDF5; returns
  // the file offset of its bytes (the caller writes them after close(); see write_extents).
  std::uint64_t allocate_f32(const std::string& group, const std::string& name, const std::vector<std::int64_t>& shape);
  // The shape of "/group/name"; throws when it does not exist or is not fp32.
  std::vector<std::int64_t> shape_f32(const std::string& group, const std::string& name) const;
  // Reads all of "/group/name" (of shape `shape`) into `out`.
  void read_f32(const std::string& group, const std::string& name, float* out) const;
  // Reads the file's `src` slab of "/group/name" (shape src_shape) into the `dst` slab of a
  // row-major buffer of shape dst_shape.
  void read_slab_f32(const std::string& group, const std::string& name, const std::vector<std::int64_t>& src_shape,
                     Slab src, float* dst, const std::vector<std::int64_t>& dst_shape, Slab dst_slab) const;

  // A virtual dataset "/group/name" of global `shape` mapping each (source file, dataset, source slab)
  // onto a destination slab.
  struct VirtualSource {
    std::string file, dataset;
    std::vector<std::int64_t> src_shape;
    Slab src, dst;
  };
  void create_virtual_f32(const std::string& group, const std::string& name, const std::vector<std::int64_t>& shape,
                          const std::vector<VirtualSource>& sources);
  void close();

 private:
  hid_t group_for_write(const std::string& group);
  std::string path_;
  H5Handle file_;
  std::vector<std::pair<std::string, H5Handle>> groups_;
};

// Writes byte ranges of an existing file at their offsets and fsyncs it: through O_DIRECT from several threads
// (the page cache halves the write speed of large checkpoints), straight from 4 KiB-aligned memory or through
// each thread's aligned buffer; buffered where the file system refuses O_DIRECT, for small extents and for
// unaligned heads and tails. Returns the XXH64 checksum string of each extent, computed meanwhile.
struct Extent {
  std::uint64_t offset = 0;
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
};
std::vector<std::string> write_extents(const std::string& path, const std::vector<Extent>& extents);

// fsync of a closed file by path (HDF5 has no fsync of its own).
void fsync_file(const std::string& path);

}  // namespace dlm::ckpt::detail
