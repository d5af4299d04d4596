#include "dlm/common/mapped_file.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"

TEST(MappedFile, MapsContents) {
  auto path = std::filesystem::temp_directory_path() / ("dlm_map_" + std::to_string(::getpid()));
  dlm::write_file_atomically(path.string(), "abc");
  dlm::MappedFile f(path.string());
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f.data()[2], 'c');
  dlm::MappedFile moved = std::move(f);
  EXPECT_EQ(moved.size(), 3u);
  EXPECT_EQ(f.size(), 0u);
  std::filesystem::remove(path);
}

TEST(MappedFile, EmptyFile) {
  auto path = std::filesystem::temp_directory_path() / ("dlm_map_empty_" + std::to_string(::getpid()));
  dlm::write_file_atomically(path.string(), "");
  dlm::MappedFile f(path.string());
  EXPECT_EQ(f.size(), 0u);
  std::filesystem::remove(path);
}

TEST(MappedFile, MissingFileNamesIt) {
  try {
    dlm::MappedFile f("/nonexistent/x.bin");
    FAIL();
  } catch (const dlm::Error& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/x.bin: cannot open: No such file or directory");
  }
}

TEST(MappedFile, FolderIsRefused) {
  EXPECT_THROW(dlm::MappedFile("/tmp"), dlm::Error);
}
