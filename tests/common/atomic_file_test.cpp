#include "dlm/common/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "dlm/common/error.h"

namespace fs = std::filesystem;

namespace {
fs::path fresh_dir(const char* name) {
  fs::path dir = fs::temp_directory_path() / (std::string("dlm_") + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}
std::size_t count_entries(const fs::path& dir) {
  return static_cast<std::size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}
}  // namespace

TEST(AtomicFile, NothingVisibleUntilCommit) {
  auto dir = fresh_dir("atomic1");
  auto target = (dir / "out.bin").string();
  {
    dlm::AtomicFile f(target, 4);
    f.write("hello, world");  // larger than the buffer: goes straight to the file
    f.write("!");
    EXPECT_FALSE(fs::exists(target));
    EXPECT_TRUE(fs::exists(f.temp_path()));
    f.commit();
  }
  EXPECT_EQ(dlm::read_text_file(target), "hello, world!");
  EXPECT_EQ(count_entries(dir), 1u);
  fs::remove_all(dir);
}

TEST(AtomicFile, AbandonedOnDestructionLeavesNothing) {
  auto dir = fresh_dir("atomic2");
  auto target = (dir / "out.bin").string();
  {
    dlm::AtomicFile f(target);
    f.write("partial");
  }
  EXPECT_FALSE(fs::exists(target));
  EXPECT_EQ(count_entries(dir), 0u);
  fs::remove_all(dir);
}

TEST(AtomicFile, ReplacesSymlinkInsteadOfWritingThroughIt) {
  auto dir = fresh_dir("atomic3");
  auto victim = (dir / "victim.txt").string();
  dlm::write_file_atomically(victim, "keep me");
  fs::create_symlink(victim, dir / "out.txt");
  dlm::write_file_atomically((dir / "out.txt").string(), "new");
  EXPECT_EQ(dlm::read_text_file(victim), "keep me");
  EXPECT_FALSE(fs::is_symlink(dir / "out.txt"));
  EXPECT_EQ(dlm::read_text_file((dir / "out.txt").string()), "new");
  fs::remove_all(dir);
}

TEST(AtomicFile, PermissionsFollowUmask) {
  auto dir = fresh_dir("atomic4");
  mode_t old = ::umask(027);
  dlm::write_file_atomically((dir / "f").string(), "x");
  ::umask(old);
  struct stat st {};
  ASSERT_EQ(::stat((dir / "f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  fs::remove_all(dir);
}

TEST(AtomicFile, MissingFolderIsAClearError) {
  try {
    dlm::AtomicFile f("/nonexistent_dlm_dir/out.bin");
    FAIL();
  } catch (const dlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent_dlm_dir/out.bin"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos);
  }
}
