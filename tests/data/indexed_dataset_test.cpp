#include "dlm/data/indexed_dataset.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"

namespace fs = std::filesystem;
using dlm::data::DType;
using dlm::data::IndexedDataset;
using dlm::data::IndexedDatasetWriter;

namespace {

class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dlm_idx_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string prefix(const char* name) const { return (dir_ / name).string(); }

  // Three documents: [1 2 3], [4 5 | 6] (two sentences), [] (one empty sentence).
  void write_sample(const std::string& p, DType dtype) const {
    IndexedDatasetWriter w(p, dtype);
    std::vector<int32_t> a{1, 2, 3}, b{4, 5}, c{6}, e{};
    w.add_item(a);
    w.end_document();
    w.add_item(b);
    w.add_item(c);
    w.end_document();
    w.add_item(e);
    w.end_document();
    w.finalize();
  }

  fs::path dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dlm::Error& e) {
    return e.what();
  }
  return "<no error>";
}

void patch(const std::string& path, std::size_t offset, const void* bytes, std::size_t n) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
}

}  // namespace

TEST_F(IndexedDatasetTest, ExactBytesOfTheIndex) {
  write_sample(prefix("s"), DType::kUInt16);
  std::string idx = dlm::read_text_file(prefix("s") + ".idx");
  ASSERT_EQ(idx.size(), 34u + 4 * 4 + 8 * 4 + 8 * 4);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  auto u64 = [&](std::size_t at) { uint64_t v; std::memcpy(&v, idx.data() + at, 8); return v; };
  EXPECT_EQ(u64(9), 1u);
  EXPECT_EQ(static_cast<uint8_t>(idx[17]), 8u);  // uint16
  EXPECT_EQ(u64(18), 4u);                         // sequences
  EXPECT_EQ(u64(26), 4u);                         // documents + 1
  int32_t lengths[4];
  int64_t pointers[4], docs[4];
  std::memcpy(lengths, idx.data() + 34, 16);
  std::memcpy(pointers, idx.data() + 50, 32);
  std::memcpy(docs, idx.data() + 82, 32);
  EXPECT_EQ(std::vector<int32_t>(lengths, lengths + 4), (std::vector<int32_t>{3, 2, 1, 0}));
  EXPECT_EQ(std::vector<int64_t>(pointers, pointers + 4), (std::vector<int64_t>{0, 6, 10, 12}));
  EXPECT_EQ(std::vector<int64_t>(docs, docs + 4), (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(fs::file_size(prefix("s") + ".bin"), 12u);
}

TEST_F(IndexedDatasetTest, ReadsBackSequencesDocumentsAndSlices) {
  for (DType dtype : {DType::kUInt16, DType::kInt32}) {
    write_sample(prefix("s"), dtype);
    IndexedDataset ds(prefix("s"));
    ds.validate();
    EXPECT_EQ(ds.dtype(), dtype);
    EXPECT_EQ(ds.num_sequences(), 4u);
    EXPECT_EQ(ds.num_documents(), 3u);
    EXPECT_EQ(ds.sequence(0), (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(ds.sequence(0, 1, 2), (std::vector<int32_t>{2, 3}));
    EXPECT_EQ(ds.sequence(0, 1), (std::vector<int32_t>{2, 3}));
    EXPECT_EQ(ds.document(1), (std::vector<int32_t>{4, 5, 6}));
    EXPECT_TRUE(ds.document(2).empty());
    EXPECT_THROW(ds.sequence(4), dlm::Error);
    EXPECT_THROW(ds.sequence(0, 2, 2), dlm::Error);
    EXPECT_THROW(ds.document(3), dlm::Error);
  }
}

TEST_F(IndexedDatasetTest, AppendShiftsPointersAndDocuments) {
  write_sample(prefix("a"), DType::kInt32);
  write_sample(prefix("b"), DType::kInt32);
  IndexedDatasetWriter w(prefix("m"), DType::kInt32);
  w.append(prefix("a"));
  std::vector<int32_t> x{9};
  w.add_item(x);
  w.end_document();
  w.append(prefix("b"));
  w.finalize();
  IndexedDataset m(prefix("m"));
  m.validate();
  EXPECT_EQ(m.num_sequences(), 9u);
  EXPECT_EQ(m.num_documents(), 7u);
  EXPECT_EQ(m.document(3), (std::vector<int32_t>{9}));
  EXPECT_EQ(m.document(5), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(m.document_indices().to_vector(), (std::vector<int64_t>{0, 1, 3, 4, 5, 6, 8, 9}));
}

TEST_F(IndexedDatasetTest, AppendRefusesOtherDtype) {
  write_sample(prefix("a"), DType::kUInt16);
  IndexedDatasetWriter w(prefix("m"), DType::kInt32);
  EXPECT_NE(error_of([&] { w.append(prefix("a")); }).find("dtype uint16 differs"), std::string::npos);
}

TEST_F(IndexedDatasetTest, IdsThatDoNotFitAreRefused) {
  IndexedDatasetWriter w(prefix("a"), DType::kUInt16);
  std::vector<int32_t> big{70000};
  EXPECT_NE(error_of([&] { w.add_item(big); }).find("token id 70000 does not fit"), std::string::npos);
}

TEST_F(IndexedDatasetTest, NothingLeftWhenNotFinalized) {
  {
    IndexedDatasetWriter w(prefix("a"), DType::kUInt16);
    std::vector<int32_t> x{1, 2};
    w.add_item(x);
    w.end_document();
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
}

TEST_F(IndexedDatasetTest, OptimalDtypeFollowsMegatron) {
  EXPECT_EQ(dlm::data::optimal_token_dtype(50304), DType::kUInt16);
  EXPECT_EQ(dlm::data::optimal_token_dtype(65499), DType::kUInt16);
  EXPECT_EQ(dlm::data::optimal_token_dtype(65500), DType::kInt32);
  EXPECT_EQ(dlm::data::optimal_token_dtype(std::nullopt), DType::kInt32);
}

TEST_F(IndexedDatasetTest, TruncatedIndex) {
  write_sample(prefix("s"), DType::kUInt16);
  fs::resize_file(prefix("s") + ".idx", 20);
  EXPECT_EQ(error_of([&] { IndexedDataset ds(prefix("s")); }),
            prefix("s") + ".idx: truncated header: 20 bytes, expected at least 34");
  write_sample(prefix("s"), DType::kUInt16);
  fs::resize_file(prefix("s") + ".idx", 100);
  EXPECT_NE(error_of([&] { IndexedDataset ds(prefix("s")); }).find(".idx: truncated: 4 sequences"), std::string::npos);
}

TEST_F(IndexedDatasetTest, WrongMagicVersionDtype) {
  write_sample(prefix("s"), DType::kUInt16);
  patch(prefix("s") + ".idx", 0, "XX", 2);
  EXPECT_EQ(error_of([&] { IndexedDataset ds(prefix("s")); }),
            prefix("s") + ".idx: offset 0: bad magic, expected \"MMIDIDX\\0\\0\"");
  write_sample(prefix("s"), DType::kUInt16);
  uint64_t v = 2;
  patch(prefix("s") + ".idx", 9, &v, 8);
  EXPECT_EQ(error_of([&] { IndexedDataset ds(prefix("s")); }), prefix("s") + ".idx: offset 9: unsupported version 2, expected 1");
  write_sample(prefix("s"), DType::kUInt16);
  uint8_t code = 9;
  patch(prefix("s") + ".idx", 17, &code, 1);
  EXPECT_EQ(error_of([&] { IndexedDataset ds(prefix("s")); }), prefix("s") + ".idx: offset 17: unknown dtype code 9, expected 1..8");
}

TEST_F(IndexedDatasetTest, BinShorterThanIndex) {
  write_sample(prefix("s"), DType::kUInt16);
  fs::resize_file(prefix("s") + ".bin", 11);
  EXPECT_EQ(error_of([&] { IndexedDataset ds(prefix("s")); }),
            prefix("s") + ".bin: shorter than the index says: sequence 2 of " + prefix("s") +
                ".idx ends at byte 12, the file has 11 bytes");
}

// every reader opens through the constructor, so a crafted index is refused there (inspect
// and dlm-blend sample used to read before the .bin mapping; dlm-blend build and dlm-train accepted it).
TEST_F(IndexedDatasetTest, PointerPastEndOfBin) {
  write_sample(prefix("s"), DType::kUInt16);
  int64_t ptr = 1000;
  patch(prefix("s") + ".idx", 50 + 8, &ptr, 8);  // pointer of sequence 1
  EXPECT_EQ(error_of([&] { IndexedDataset ds(prefix("s")); }),
            prefix("s") + ".idx: offset 58: sequence 1 pointer 1000 is not the running sum of lengths (6)");
}

TEST_F(IndexedDatasetTest, DocumentIndexOutOfRange) {
  write_sample(prefix("s"), DType::kUInt16);
  int64_t d = 99;
  patch(prefix("s") + ".idx", 82 + 16, &d, 8);
  EXPECT_EQ(error_of([&] { IndexedDataset ds(prefix("s")); }),
            prefix("s") + ".idx: offset 98: document index 2 = 99 is not monotone within [0, 4]");
}

TEST_F(IndexedDatasetTest, CraftedIndexIsRefusedWhenOpened) {
  const std::string idx = prefix("s") + ".idx";
  auto open_error = [&] { return error_of([&] { IndexedDataset ds(prefix("s")); }); };
  write_sample(prefix("s"), DType::kUInt16);
  int64_t negative_ptr = -6;
  patch(idx, 50 + 8, &negative_ptr, 8);
  EXPECT_EQ(open_error(), idx + ": offset 58: sequence 1 pointer -6 is not the running sum of lengths (6)");
  write_sample(prefix("s"), DType::kUInt16);
  int32_t negative_len = -2;
  patch(idx, 34 + 4, &negative_len, 4);
  EXPECT_EQ(open_error(), idx + ": offset 38: sequence 1 has negative length -2");
  write_sample(prefix("s"), DType::kUInt16);
  int64_t docs[2] = {3, 1};  // 0, 3, 1, 4: not monotone
  patch(idx, 82 + 8, docs, 16);
  EXPECT_EQ(open_error(), idx + ": offset 98: document index 2 = 1 is not monotone within [0, 4]");
  write_sample(prefix("s"), DType::kUInt16);
  { std::ofstream(idx, std::ios::app | std::ios::binary) << "xyz"; }
  EXPECT_EQ(open_error(), idx + ": offset 114: 3 unexpected trailing bytes");
}

// a .bin that is not exactly what its .idx describes (trailing bytes, or a .bin rewritten
// under an older .idx) is refused by every reader, validate included.
TEST_F(IndexedDatasetTest, BinLongerThanItsIndexOrAStalePairIsRefused) {
  write_sample(prefix("s"), DType::kUInt16);
  { std::ofstream(prefix("s") + ".bin", std::ios::app | std::ios::binary) << "ab"; }
  const std::string expected = prefix("s") + ".bin: 14 bytes, but " + prefix("s") +
                               ".idx describes 12 bytes of tokens (a stale or mismatched .bin/.idx pair, or trailing bytes)";
  EXPECT_EQ(error_of([&] { IndexedDataset ds(prefix("s")); }), expected);
  // A newer, longer dataset's .bin beside the old .idx.
  write_sample(prefix("s"), DType::kUInt16);
  const std::string old_idx = dlm::read_text_file(prefix("s") + ".idx");
  IndexedDatasetWriter w(prefix("s"), DType::kUInt16);
  std::vector<int32_t> more{7, 8, 9, 10, 11, 12, 13};
  w.add_item(more);
  w.end_document();
  w.finalize();
  dlm::write_file_atomically(prefix("s") + ".idx", old_idx);
  EXPECT_NE(error_of([&] { IndexedDataset ds(prefix("s")); }).find(".bin: 14 bytes, but"), std::string::npos);
}

// negative ids in a signed .bin are refused by validate and by every read.
TEST_F(IndexedDatasetTest, NegativeTokenIdsAreRefused) {
  IndexedDatasetWriter w(prefix("s"), DType::kInt32);
  std::vector<int32_t> a{1, -7, 3};
  w.add_item(a);
  w.end_document();
  w.finalize();
  IndexedDataset ds(prefix("s"));
  EXPECT_EQ(error_of([&] { ds.validate(); }), prefix("s") + ".bin: offset 4: token id -7 is negative, expected ids >= 0");
  EXPECT_EQ(error_of([&] { ds.sequence(0); }), "int32 token -7 (element 1) is negative, expected ids >= 0");
  const auto range = dlm::data::token_range(ds);
  EXPECT_EQ(range.min, -7);
  EXPECT_EQ(range.max, 3);
  EXPECT_EQ(range.min_offset, 4u);
}

TEST_F(IndexedDatasetTest, HugeCountsDoNotAllocate) {
  write_sample(prefix("s"), DType::kUInt16);
  uint64_t n = ~uint64_t{0} / 2;
  patch(prefix("s") + ".idx", 18, &n, 8);
  EXPECT_NE(error_of([&] { IndexedDataset ds(prefix("s")); }).find("truncated"), std::string::npos);
}

TEST_F(IndexedDatasetTest, MissingFilesNameThem) {
  EXPECT_EQ(error_of([&] { IndexedDataset ds(prefix("none")); }),
            prefix("none") + ".idx: cannot open: No such file or directory");
}
