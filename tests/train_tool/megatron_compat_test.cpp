// docs/megatron-compat.md's table held to dlm-train: each row's flag (with its test value) appended to a small
// dry run is accepted (implemented, accepted), accepted and named in the start-up line (no effect), or refused
// with exit 2 and one line naming the flag (refused); accepted flags are listed by --help. Every flag of MegaDLMs'
// 1.7B script has a row.
#include <set>

#include "tool_fixture.h"

namespace fs = std::filesystem;

namespace dlm::test {
namespace {

struct Row {
  std::string flag;
  std::vector<std::string> value;
  std::string status;
};

std::string between_backticks(const std::string& cell) {
  const auto a = cell.find('`'), b = cell.rfind('`');
  return a == std::string::npos || b == a ? "" : cell.substr(a + 1, b - a - 1);
}

std::vector<Row> table_rows() {
  std::ifstream in(DLM_COMPAT_DOC);
  std::vector<Row> rows;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `--", 0) != 0) continue;
    std::vector<std::string> cells;
    for (std::size_t at = 1; at < line.size();) {
      const auto bar = line.find('|', at);
      if (bar == std::string::npos) break;
      cells.push_back(line.substr(at, bar - at));
      at = bar + 1;
    }
    if (cells.size() < 3) continue;
    Row r{between_backticks(cells[0]), {}, cells[2]};
    std::istringstream words(between_backticks(cells[1]));
    for (std::string w; words >> w;) r.value.push_back(w);
    r.status = r.status.substr(r.status.find_first_not_of(' '));
    r.status = r.status.substr(0, r.status.find_last_not_of(' ') + 1);
    rows.push_back(r);
  }
  return rows;
}

using MegatronCompat = ToolTest;

TEST_F(MegatronCompat, EveryRowsClaimHolds) {
  const auto rows = table_rows();
  ASSERT_GE(rows.size(), 140u);
  const fs::path out = dir_ / "out";
  ASSERT_EQ(run_keeping_stdout({kTrainTool, "--help"}, out).exit_code, 0);
  const std::string help = read_all(out);
  for (const Row& row : rows) {
    std::vector<std::string> argv = {kTrainTool, "--dry-run", "--world-size", "8", "--num-layers", "4", "--hidden-size",
                                     "128", "--ffn-hidden-size", "256", "--num-attention-heads", "8", "--seq-length",
                                     "32", "--max-position-embeddings", "64", "--vocab-size", "256",
                                     "--micro-batch-size", "1", "--global-batch-size", "8", "--device", "cpu", row.flag};
    argv.insert(argv.end(), row.value.begin(), row.value.end());
    // Training is given in iterations or in samples, not both (Megatron's rule).
    if (row.flag != "--train-samples" && std::find(row.value.begin(), row.value.end(), "--train-samples") == row.value.end())
      argv.insert(argv.end(), {"--train-iters", "100"});
    const auto r = run(argv);
    std::string what = row.flag;
    for (const auto& v : row.value) what += " " + v;
    SCOPED_TRACE(what + " (" + row.status + ")");
    if (row.status == "refused") {
      EXPECT_EQ(r.exit_code, 2) << r.err;
      const std::string line = last_error_line(r, "dlm-train");
      EXPECT_NE(line.find(row.flag), std::string::npos) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    } else {
      ASSERT_TRUE(row.status == "implemented" || row.status == "accepted" || row.status == "no effect") << row.status;
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_NE(help.find("  " + row.flag + " "), std::string::npos) << "not in --help";
      if (row.status == "no effect") {
        const auto at = r.err.find("accepted, no effect in dlm");
        ASSERT_NE(at, std::string::npos) << r.err;
        EXPECT_NE(r.err.find(row.flag, at), std::string::npos) << r.err;
      } else {
        EXPECT_EQ(r.err.find("no effect"), std::string::npos) << r.err;
      }
    }
  }
}

TEST_F(MegatronCompat, EveryFlagOfTheMegaDlmsScriptHasARow) {
  std::set<std::string> in_table;
  for (const Row& r : table_rows()) in_table.insert(r.flag);
  std::ifstream in(fs::path(DLM_TRAIN_TOOL_DATA) / "megadlms_dlm_pretrain_1.7b.args");
  int flags = 0;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("--", 0) == 0) {
      ++flags;
      EXPECT_TRUE(in_table.count(line)) << line << " has no row in docs/megatron-compat.md";
    }
  EXPECT_EQ(flags, 83);
}

}  // namespace
}  // namespace dlm::test
