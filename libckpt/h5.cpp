#include "h5.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/common/mapped_file.h"

namespace dlm::ckpt::detail {
namespace {

// Before HDF5's first call: errors are ours to report (no stack printed on stderr), and no atexit handler.
// HDF5 1.10's handler closes every file still open at exit, and a file whose H5Fclose failed (a full
// disk) stays in its table: the handler then crashed in H5F__close_cb after dlm-train had printed its
// error (found by the full-disk test). dlm closes every file it opens, so it needs no handler.
void quiet_hdf5() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

// An HDF5 call failed: the error stack HDF5 built for it is cleared before the throw. Error stacks are per
// thread; a background save's thread would otherwise end holding its records (leaked at the thread's exit).
[[noreturn]] void fail_h5(const std::string& file, std::string message) {
  H5Eclear2(H5E_DEFAULT);
  fail_at(file, std::move(message));
}

std::vector<hsize_t> dims_of(const std::vector<std::int64_t>& shape) { return {shape.begin(), shape.end()}; }

// A dataspace of `shape` with the slab selected (everything without one).
H5Handle space(const std::vector<std::int64_t>& shape, const Slab* slab, const std::string& file) {
  const auto dims = dims_of(shape);
  H5Handle s(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  if (s.get() < 0) fail_h5(file, "cannot create an HDF5 dataspace");
  if (slab) {
    const std::vector<hsize_t> start(slab->start.begin(), slab->start.end()), count(slab->length.begin(), slab->length.end());
    if (H5Sselect_hyperslab(s.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0)
      fail_h5(file, "cannot select an HDF5 hyperslab");
  }
  return s;
}

}  // namespace

H5File H5File::create(const std::string& path) {
  quiet_hdf5();
  H5File f;
  f.path_ = path;
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_alignment(fapl.get(), 4096, 4096);
  f.file_ = H5Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (f.file_.get() < 0) fail_h5(path, "cannot create the HDF5 file");
  return f;
}

H5File H5File::open_read(const std::string& path) {
  quiet_hdf5();
  H5File f;
  f.path_ = path;
  require_regular_file(path);
  f.file_ = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.file_.get() < 0) fail_h5(path, "cannot open as an HDF5 file (missing or damaged)");
  return f;
}

hid_t H5File::group_for_write(const std::string& group) {
  for (auto& [name, h] : groups_)
    if (name == group) return h.get();
  H5Handle g(H5Gcreate2(file_.get(), group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (g.get() < 0) fail_h5(path_, fmt::format("cannot create HDF5 group '{}'", group));
  groups_.emplace_back(group, std::move(g));
  return groups_.back().second.get();
}

void H5File::write_f32(const std::string& group, const std::string& name, const std::vector<std::int64_t>& shape, const float* data) {
  const hid_t g = group_for_write(group);
  H5Handle s = space(shape, nullptr, path_);
  H5Handle d(H5Dcreate2(g, name.c_str(), H5T_IEEE_F32LE, s.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (d.get() < 0) fail_h5(path_, fmt::format("cannot create dataset /{}/{}", group, name));
  std::int64_t n = 1;
  for (std::int64_t x : shape) n *= x;
  if (n > 0 && H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail_h5(path_, fmt::format("cannot write dataset /{}/{} (disk full?)", group, name));
}

std::uint64_t H5File::allocate_f32(const std::string& group, const std::string& name, const std::vector<std::int64_t>& shape) {
  const hid_t g = group_for_write(group);
  H5Handle s = space(shape, nullptr, path_);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  H5Handle d(H5Dcreate2(g, name.c_str(), H5T_IEEE_F32LE, s.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (d.get() < 0) fail_h5(path_, fmt::format("cannot create dataset /{}/{}", group, name));
  const haddr_t offset = H5Dget_offset(d.get());
  return offset == HADDR_UNDEF ? 0 : static_cast<std::uint64_t>(offset);
}

std::vector<std::int64_t> H5File::shape_f32(const std::string& group, const std::string& name) const {
  const std::string full = "/" + group + "/" + name;
  H5Handle d(H5Dopen2(file_.get(), full.c_str(), H5P_DEFAULT), H5Dclose);
  if (d.get() < 0) fail_h5(path_, fmt::format("dataset {} is missing", full));
  H5Handle t(H5Dget_type(d.get()), H5Tclose);
  if (H5Tget_class(t.get()) != H5T_FLOAT || H5Tget_size(t.get()) != 4) fail_h5(path_, fmt::format("dataset {} is not float32", full));
  H5Handle s(H5Dget_space(d.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(s.get());
  if (rank < 0 || rank > 8) fail_h5(path_, fmt::format("dataset {}: bad dataspace", full));
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

void H5File::read_f32(const std::string& group, const std::string& name, float* out) const {
  const std::string full = "/" + group + "/" + name;
  H5Handle d(H5Dopen2(file_.get(), full.c_str(), H5P_DEFAULT), H5Dclose);
  if (d.get() < 0) fail_h5(path_, fmt::format("dataset {} is missing", full));
  if (H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    fail_h5(path_, fmt::format("cannot read dataset {} (file truncated or damaged)", full));
}

void H5File::read_slab_f32(const std::string& group, const std::string& name, const std::vector<std::int64_t>& src_shape,
                           Slab src, float* dst, const std::vector<std::int64_t>& dst_shape, Slab dst_slab) const {
  const std::string full = "/" + group + "/" + name;
  H5Handle d(H5Dopen2(file_.get(), full.c_str(), H5P_DEFAULT), H5Dclose);
  if (d.get() < 0) fail_h5(path_, fmt::format("dataset {} is missing", full));
  H5Handle fs = space(src_shape, &src, path_), ms = space(dst_shape, &dst_slab, path_);
  if (H5Dread(d.get(), H5T_NATIVE_FLOAT, ms.get(), fs.get(), H5P_DEFAULT, dst) < 0)
    fail_h5(path_, fmt::format("cannot read a slab of dataset {} (file truncated or damaged)", full));
}

void H5File::create_virtual_f32(const std::string& group, const std::string& name, const std::vector<std::int64_t>& shape,
                                const std::vector<VirtualSource>& sources) {
  const hid_t g = group_for_write(group);
  H5Handle vs = space(shape, nullptr, path_);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  for (const VirtualSource& v : sources) {
    H5Handle dst = space(shape, &v.dst, path_), src = space(v.src_shape, &v.src, path_);
    if (H5Pset_virtual(dcpl.get(), dst.get(), v.file.c_str(), v.dataset.c_str(), src.get()) < 0)
      fail_h5(path_, fmt::format("cannot map {}:{} into virtual dataset /{}/{}", v.file, v.dataset, group, name));
  }
  H5Handle d(H5Dcreate2(g, name.c_str(), H5T_IEEE_F32LE, vs.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (d.get() < 0) fail_h5(path_, fmt::format("cannot create virtual dataset /{}/{}", group, name));
}

void H5File::close() {
  groups_.clear();
  const hid_t id = file_.release();
  if (id >= 0 && H5Fclose(id) < 0) fail_h5(path_, "cannot close the HDF5 file (disk full?)");
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno(path, "open for fsync", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail_errno(path, "fsync", err);
}

}  // namespace dlm::ckpt::detail
