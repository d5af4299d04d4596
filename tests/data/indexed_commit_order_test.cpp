// The .bin/.idx pair is committed so that a writer killed between its two renames never leaves a new .bin
// under an old .idx. The kill is made exact by interposing rename(): a child process
// writing over an existing dataset exits right after its .bin is renamed into place.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "dlm/data/indexed_dataset.h"

namespace {
bool g_exit_after_bin_rename = false;
}

// Resolved before libc's for every caller in this test binary; only the child that sets the flag differs.
extern "C" int rename(const char* from, const char* to) {
  using RenameFn = int (*)(const char*, const char*);
  static auto real = reinterpret_cast<RenameFn>(::dlsym(RTLD_NEXT, "rename"));
  const int rc = real(from, to);
  const std::string target(to);
  if (g_exit_after_bin_rename && rc == 0 && target.size() > 4 && target.ends_with(".bin")) ::_exit(0);
  return rc;
}

namespace {

namespace fs = std::filesystem;
using dlm::data::DType;
using dlm::data::IndexedDataset;
using dlm::data::IndexedDatasetWriter;

void write(const std::string& prefix, const std::vector<std::vector<std::int32_t>>& documents) {
  IndexedDatasetWriter w(prefix, DType::kUInt16);
  for (const auto& d : documents) {
    w.add_item(d);
    w.end_document();
  }
  w.finalize();
}

TEST(IndexedCommitOrder, KillBetweenTheRenamesLeavesNoStalePair) {
  const fs::path dir = fs::temp_directory_path() / ("dlm_commit_order_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string prefix = (dir / "d").string();
  write(prefix, {{1, 2}, {3}});  // the old dataset: 6 bytes of .bin, two documents
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    g_exit_after_bin_rename = true;
    write(prefix, {{7, 8, 9}});  // the same .bin size, one document
    ::_exit(3);                  // not reached: rename() exits first
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child did not stop between the renames";
  // The old .idx must not describe the new .bin: either no .idx (refused as missing) or a consistent pair.
  std::string error;
  try {
    IndexedDataset ds(prefix);
    ds.validate();
    const auto first = ds.document(0);
    ADD_FAILURE() << "opened a stale pair: " << ds.num_documents() << " documents, the first of " << first.size()
                  << " tokens starting with " << first.at(0);
  } catch (const dlm::Error& e) {
    error = e.what();
  }
  EXPECT_EQ(error, prefix + ".idx: cannot open: No such file or directory");
  fs::remove_all(dir);
}

}  // namespace
