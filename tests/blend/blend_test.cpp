// GPTDataset / BlendedDataset indices against values printed by megatron-core 0.16.1 (its
// helpers_cpp, _build_document_index, _build_shuffle_index, normalize, parse_and_normalize_split),
// the sample reader on hand-made data, and every bad input dlm-blend refuses as a one-line error.
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <gtest/gtest.h>

#include "../common/sanitized.h"

#include "dlm/common/error.h"
#include "dlm/data/blend.h"
#include "dlm/data/blend_args.h"
#include "dlm/data/sample_reader.h"
#include "../../libdata/blend/fast_shuffle.h"

namespace fs = std::filesystem;
using namespace dlm::data;

namespace {

template <typename T = std::int64_t>
std::vector<T> values(const NpyArray& a) {
  std::vector<T> out;
  for (std::size_t i = 0; i < a.size(); ++i) out.push_back(static_cast<T>(a[i]));
  return out;
}

TEST(Blending, WeightedIndicesMatchHelpers) {
  const std::vector<double> w{0.5, 0.3, 0.2};
  const auto b = build_blending_indices(w, 12);
  EXPECT_EQ(b.dataset_index.type(), NpyType::kInt16);
  EXPECT_EQ(b.dataset_sample_index.type(), NpyType::kInt64);
  EXPECT_EQ(values(b.dataset_index), (std::vector<std::int64_t>{0, 1, 2, 0, 1, 0, 2, 0, 1, 0, 0, 1}));
  EXPECT_EQ(values(b.dataset_sample_index), (std::vector<std::int64_t>{0, 0, 0, 1, 1, 2, 1, 3, 2, 4, 5, 3}));
}

TEST(Blending, ExhaustiveIndicesMatchHelpers) {
  const std::vector<std::int64_t> sizes{2, 4, 3};
  const auto b = build_exhaustive_blending_indices(sizes);
  EXPECT_EQ(values(b.dataset_index), (std::vector<std::int64_t>{1, 2, 0, 1, 2, 1, 0, 2, 1}));
  EXPECT_EQ(values(b.dataset_sample_index), (std::vector<std::int64_t>{0, 0, 0, 1, 1, 2, 1, 2, 3}));
}

TEST(Blending, WeightsAndSplits) {
  const std::vector<double> w{3, 1, 2.5};
  const auto n = normalize_weights(w);
  EXPECT_DOUBLE_EQ(n[0], 0.46153846153846156);
  EXPECT_DOUBLE_EQ(n[1], 0.15384615384615385);
  EXPECT_DOUBLE_EQ(n[2], 0.38461538461538464);

  const auto s = parse_split("969,30,1");
  EXPECT_DOUBLE_EQ(s[0], 0.969);
  EXPECT_DOUBLE_EQ(s[1], 0.03);
  EXPECT_DOUBLE_EQ(s[2], 0.001);
  const auto m = split_matrix(s);
  ASSERT_TRUE(m[0] && m[1] && m[2]);
  EXPECT_DOUBLE_EQ(m[1]->first, 0.969);
  EXPECT_DOUBLE_EQ(m[1]->second, 0.999);
  EXPECT_DOUBLE_EQ(m[2]->second, 1.0);

  const auto z = split_matrix(parse_split("8,0,2"));
  ASSERT_TRUE(m[0]);
  EXPECT_FALSE(z[1].has_value());
  EXPECT_DOUBLE_EQ(z[2]->first, 0.8);
  // round(0.8 * 11) = 9, round(2.5) = 2 (ties to even).
  EXPECT_EQ(split_range({0.0, 0.8}, 11), (std::pair<std::int64_t, std::int64_t>{0, 9}));
  EXPECT_EQ(split_range({0.0, 0.5}, 5).second, 2);

  const std::vector<std::string> args{"0.3 /a/b", "0.7", "/c/d"};
  const auto b = parse_blend(args);
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"/a/b", "/c/d"}));
  EXPECT_EQ(*b.weights, (std::vector<double>{0.3, 0.7}));
  const std::vector<std::string> plain{"/a/b /c/d"};
  EXPECT_FALSE(parse_blend(plain).weights.has_value());
}

// Six weights down to 0.001 that numpy sums to exactly 1.0 (pairwise from 0), so
// megatron-core's BlendedDataset sizes are 60000 / 1302 / 102 for 60000 / 1300 / 100; summing
// from the first weight gives 1 - 2^-53 and 60006 / 1305 / 105.
TEST(Blending, WeightsNormalizeAsNumpySums) {
  const std::vector<double> w{0.498, 0.3, 0.15, 0.05, 0.001, 0.001};
  const auto n = normalize_weights(w);
  EXPECT_EQ(n, w);
  std::int64_t sizes[3] = {0, 0, 0};
  const std::int64_t targets[3] = {60000, 1300, 100};
  for (std::size_t i = 0; i < 3; ++i)
    for (double x : n) sizes[i] += static_cast<std::int64_t>(std::ceil(static_cast<double>(targets[i]) * x));
  EXPECT_EQ(sizes[0], 60000);
  EXPECT_EQ(sizes[1], 1302);
  EXPECT_EQ(sizes[2], 102);
}

// The fast shuffle (blocked, branchless draws; pipelined on two threads from 2^22 elements) against
// numpy's plain Fisher-Yates loop: same permutation, generator left in the same state.
TEST(GptIndex, FastShuffleIsNumpysShuffle) {
  for (std::size_t n : {std::size_t{2}, std::size_t{5000}, std::size_t{1} << 22, (std::size_t{1} << 22) + 12345}) {
    std::vector<std::uint32_t> fast(n), plain(n);
    std::iota(fast.begin(), fast.end(), 0u);
    plain = fast;
    NumpyRandomState a(1234), b(1234);
    detail::shuffle_like_numpy(std::span<std::uint32_t>(fast), a);
    b.shuffle(std::span<std::uint32_t>(plain));
    EXPECT_EQ(fast, plain) << n;
    EXPECT_EQ(a.next_uint32(), b.next_uint32()) << n;
  }
}

// lengths [5 3 7 2 9], seed 7, L = 4 with the extra token: 26 tokens per epoch.
TEST(GptIndex, TwoEpochsMatchMegatron) {
  const std::vector<std::int32_t> lengths{5, 3, 7, 2, 9};
  GptIndexConfig c;
  c.random_seed = 7;
  c.sequence_length = 4;
  const auto ix = build_gpt_index(lengths, 0, 5, 12, true, c);
  EXPECT_EQ(ix.num_epochs, 2);
  EXPECT_FALSE(ix.separate_final_epoch);
  EXPECT_EQ(ix.document_index.type(), NpyType::kInt32);
  EXPECT_EQ(ix.sample_index.type(), NpyType::kInt32);
  EXPECT_EQ(ix.shuffle_index.type(), NpyType::kUInt32);
  EXPECT_EQ(values(ix.document_index), (std::vector<std::int64_t>{3, 0, 0, 2, 1, 4, 2, 3, 1, 4}));
  EXPECT_EQ(values(ix.sample_index), (std::vector<std::int64_t>{0, 0, 1, 2, 2, 1, 3, 0, 3, 4, 4, 1, 5, 2, 5, 6, 6, 1,
                                                                6, 5, 8, 0, 9, 1, 9, 5}));
  EXPECT_EQ(values(ix.shuffle_index), (std::vector<std::int64_t>{1, 3, 2, 5, 9, 0, 4, 6, 7, 8, 11, 10}));
}

TEST(GptIndex, SeparateFinalEpochMatchesMegatron) {
  const std::vector<std::int32_t> lengths{5, 3, 7, 2, 9};
  GptIndexConfig c;
  c.random_seed = 7;
  c.sequence_length = 4;
  const auto ix = build_gpt_index(lengths, 0, 5, 8, true, c);
  EXPECT_EQ(ix.num_epochs, 2);
  EXPECT_TRUE(ix.separate_final_epoch);
  EXPECT_EQ(values(ix.document_index), (std::vector<std::int64_t>{0, 3, 2, 1, 4, 2, 1, 0, 4, 3}));
  EXPECT_EQ(values(ix.sample_index), (std::vector<std::int64_t>{0, 0, 0, 4, 2, 1, 2, 5, 3, 2, 4, 3, 4, 7, 5, 2, 5, 6,
                                                                7, 0, 7, 4, 8, 3, 8, 7}));
  EXPECT_EQ(values(ix.shuffle_index), (std::vector<std::int64_t>{4, 5, 3, 2, 1, 0, 7, 8, 9, 11, 10, 6}));
}

TEST(GptIndex, KeepsLastPartialWithoutExtraToken) {
  // helpers_cpp.build_sample_idx_int32(sizes, [3 0 0 2 1 4 2 3 1 4], 4, 2, 26, False, 0).
  const std::vector<std::int32_t> lengths{5, 3, 7, 2, 9};
  GptIndexConfig c;
  c.random_seed = 7;
  c.sequence_length = 4;
  c.add_extra_token_to_sequence = false;
  const auto ix = build_gpt_index(lengths, 0, 5, 13, false, c);
  EXPECT_EQ(values(ix.document_index), (std::vector<std::int64_t>{3, 0, 0, 2, 1, 4, 2, 3, 1, 4}));
  EXPECT_EQ(values(ix.sample_index), (std::vector<std::int64_t>{0, 0, 1, 2, 2, 1, 2, 5, 3, 4, 4, 1, 5, 2, 5, 6, 6, 1,
                                                                6, 5, 7, 2, 9, 1, 9, 5, 9, 9}));
}

class BlendFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dlm_blend_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Documents of `lengths` tokens: document d holds 100 * d + 1, 100 * d + 2, ..., then eod (0).
  std::string write(const std::string& name, const std::vector<int>& lengths, DType dtype = DType::kInt32) {
    const std::string p = (dir_ / name).string();
    IndexedDatasetWriter w(p, dtype);
    for (std::size_t d = 0; d < lengths.size(); ++d) {
      std::vector<std::int32_t> t;
      for (int k = 1; k < lengths[d]; ++k) t.push_back(static_cast<std::int32_t>(100 * d) + k);
      t.push_back(0);
      w.add_item(t);
      w.end_document();
    }
    w.finalize();
    return p;
  }

  BuilderConfig config(std::vector<std::string> data_path, std::int32_t seq, std::int64_t train = 10) {
    MegatronDataArgs a;
    a.data_path = std::move(data_path);
    a.split = "1,0,0";
    a.seq_length = seq;
    a.train_samples = train;
    a.global_batch_size = 1;
    a.eval_iters = 0;
    a.data_cache_path = (dir_ / "cache").string();
    return builder_config(a);
  }

  fs::path dir_;
};

// Runs f, expects a dlm::Error whose one-line message contains every one of `parts`.
template <typename F>
void expect_error(F f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const dlm::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

TEST_F(BlendFiles, SampleReaderAssemblesDocumentsAndEodOptions) {
  const auto p = write("a", {3, 4, 5});
  auto splits = build_datasets(config({p}, 4, 2));
  ASSERT_TRUE(splits[0]);
  const auto& ds = *splits[0]->datasets[0];
  EXPECT_EQ(ds.index().tokens_per_epoch, 12);
  SampleOptions o;
  o.eod = 0;
  o.reset_position_ids = true;
  o.reset_attention_mask = true;
  o.eod_mask_loss = true;
  SampleReader r(*splits[0], o);
  ASSERT_EQ(r.size(), 2u);  // (12 - 1) / 4
  // Rebuild each sample from the index by hand: concatenate the shuffled documents, cut at 4.
  std::vector<std::int32_t> stream;
  const std::vector<std::vector<std::int32_t>> docs{{1, 2, 0}, {101, 102, 103, 0}, {201, 202, 203, 204, 0}};
  for (std::size_t i = 0; i < ds.index().document_index.size(); ++i) {
    const auto& d = docs[static_cast<std::size_t>(ds.index().document_index[i])];
    stream.insert(stream.end(), d.begin(), d.end());
  }
  for (std::size_t i = 0; i < r.size(); ++i) {
    const auto row = static_cast<std::size_t>(ds.index().shuffle_index[i]);
    const Sample s = r.read(i);
    const std::vector<std::int32_t> want(stream.begin() + static_cast<std::ptrdiff_t>(4 * row),
                                         stream.begin() + static_cast<std::ptrdiff_t>(4 * row + 5));
    EXPECT_EQ(s.tokens, std::vector<std::int32_t>(want.begin(), want.begin() + 4));
    EXPECT_EQ(s.labels, std::vector<std::int32_t>(want.begin() + 1, want.end()));
    std::int32_t pos = 0, seg = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      EXPECT_EQ(s.position_ids[k], pos);
      EXPECT_EQ(s.segment_ids[k], seg);
      EXPECT_EQ(s.loss_mask[k], want[k] == 0 ? 0.0f : 1.0f);
      pos = want[k] == 0 ? 0 : pos + 1;
      seg += want[k] == 0;
    }
  }
}

TEST_F(BlendFiles, CacheIsReusedAndStaleCacheRebuilt) {
  const auto p = write("a", {30, 40, 50, 20});
  const auto first = build_datasets(config({p}, 8, 20));
  EXPECT_FALSE(first[0]->datasets[0]->loaded_from_cache());
  const auto again = build_datasets(config({p}, 8, 20));
  EXPECT_TRUE(again[0]->datasets[0]->loaded_from_cache());
  // The arrays are views of the cache files (built in place, or loaded): keep the values apart.
  const auto want = values(first[0]->datasets[0]->index().shuffle_index);
  EXPECT_EQ(values(again[0]->datasets[0]->index().shuffle_index), want);
  // Truncate the cached shuffle index: rebuilt (same values), or refused when rebuilding is off.
  const std::string shuffle = first[0]->datasets[0]->cache_base() + "shuffle_index.npy";
  fs::resize_file(shuffle, 60);
  auto c = config({p}, 8, 20);
  c.gpt.write_cache = false;
  expect_error([&] { build_datasets(c); }, {shuffle, "index cache is unusable"});
  const auto rebuilt = build_datasets(config({p}, 8, 20));
  EXPECT_FALSE(rebuilt[0]->datasets[0]->loaded_from_cache());
  EXPECT_EQ(values(rebuilt[0]->datasets[0]->index().shuffle_index), want);
}

// A split of fewer tokens than one sample is built as megatron-core builds it, over as many
// epochs as the demand needs: 10 samples of 201 tokens from 120 take ceil(2001 / 120) = 17 epochs.
TEST_F(BlendFiles, SplitShorterThanOneSampleTakesEpochs) {
  const auto a = write("a", {30, 40, 50});
  const auto splits = build_datasets(config({a}, 200, 10));
  ASSERT_TRUE(splits[0]);
  const auto& ix = splits[0]->datasets[0]->index();
  EXPECT_EQ(ix.num_epochs, 17);
  EXPECT_EQ(ix.document_index.size(), 51u);
  EXPECT_EQ(splits[0]->size(), 10u);  // (17 * 120 - 1) / 200
  EXPECT_EQ(ix.sample_index[0], 0);
  EXPECT_EQ(ix.sample_index[2 * 10] / 3, 2000 / 120);  // sample 10 starts 2000 tokens in: epoch 16
}

// Rewrites `bytes` bytes of a .npy's data at element offset `at` (of `width`-byte elements).
void patch_npy(const std::string& path, std::size_t width, std::size_t at, const void* bytes, std::size_t size) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  unsigned char head[10];
  f.read(reinterpret_cast<char*>(head), 10);
  const std::size_t data = 10 + (head[8] | (head[9] << 8));
  f.seekp(static_cast<std::streamoff>(data + width * at));
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(size));
}

template <typename T>
T npy_at(const std::string& path, std::size_t at) {
  const auto a = NpyArray::load(path);
  return static_cast<T>(a[at]);
}

// A cached index with a duplicate in shuffle_index, a non-monotone sample_index, a
// flipped byte of dataset_index, or two swapped document_index entries (every invariant holds; only
// the checksum beside the cache differs) is rebuilt, to the same arrays, and every sample reads.
TEST_F(BlendFiles, CorruptCachesAreRebuilt) {
  const auto a = write("a", std::vector<int>(40, 10));
  const auto b = write("b", {30, 40, 50, 20, 60, 10, 70});
  const auto cfg = [&] { return config({"0.7 " + a + " 0.3 " + b}, 8, 30); };
  const auto first = build_datasets(cfg());
  const auto& split = *first[0];
  ASSERT_TRUE(split.blended);
  const std::string base_a = split.datasets[0]->cache_base();
  const std::string blend_base = (dir_ / "cache" / (split.description_hash + "-BlendedDataset-train-")).string();
  const auto doc_want = values(split.datasets[0]->index().document_index);
  const auto sample_want = values(split.datasets[0]->index().sample_index);
  const auto shuffle_want = values(split.datasets[0]->index().shuffle_index);
  const auto blend_want = values(split.indices.dataset_index);
  ASSERT_TRUE(fs::exists(base_a + "checksums.dlm"));

  const auto rebuilt = [&](const char* what) {
    SCOPED_TRACE(what);
    const auto again = build_datasets(cfg());
    const auto& s = *again[0];
    EXPECT_EQ(values(s.datasets[0]->index().document_index), doc_want);
    EXPECT_EQ(values(s.datasets[0]->index().sample_index), sample_want);
    EXPECT_EQ(values(s.datasets[0]->index().shuffle_index), shuffle_want);
    EXPECT_EQ(values(s.indices.dataset_index), blend_want);
    SampleReader r(s, SampleOptions{});
    for (std::size_t i = 0; i < r.size(); ++i) EXPECT_EQ(r.read(i).tokens.size(), 8u);
    return again[0]->datasets[0]->loaded_from_cache();
  };

  const std::string shuffle = base_a + "shuffle_index.npy", sample = base_a + "sample_index.npy";
  const auto dup = npy_at<std::uint32_t>(shuffle, 0);
  patch_npy(shuffle, 4, 1, &dup, 4);
  EXPECT_FALSE(rebuilt("a duplicate in shuffle_index"));

  // Rows 1 and 2 swapped: (doc, offset) pairs no longer ascend.
  const std::int32_t rows[4] = {npy_at<std::int32_t>(sample, 4), npy_at<std::int32_t>(sample, 5),
                                npy_at<std::int32_t>(sample, 2), npy_at<std::int32_t>(sample, 3)};
  patch_npy(sample, 4, 2, rows, sizeof rows);
  EXPECT_FALSE(rebuilt("a non-monotone sample_index"));

  const std::string dataset_index = blend_base + "dataset_index.npy";
  const std::uint8_t flipped = static_cast<std::uint8_t>(npy_at<std::int16_t>(dataset_index, 3) ^ 1);
  patch_npy(dataset_index, 2, 3, &flipped, 1);
  const auto blend_again = build_datasets(cfg());
  EXPECT_FALSE(blend_again[0]->loaded_from_cache);
  EXPECT_EQ(values(blend_again[0]->indices.dataset_index), blend_want);

  // Dataset a's documents are all 10 tokens: swapping two document_index entries keeps every
  // invariant, so only the checksum can tell.
  const std::string documents = base_a + "document_index.npy";
  std::size_t j = 1;
  while (npy_at<std::int32_t>(documents, j) == npy_at<std::int32_t>(documents, 0)) ++j;
  const std::int32_t d0 = npy_at<std::int32_t>(documents, 0), dj = npy_at<std::int32_t>(documents, j);
  patch_npy(documents, 4, 0, &dj, 4);
  patch_npy(documents, 4, j, &d0, 4);
  EXPECT_FALSE(rebuilt("two swapped document_index entries"));
  EXPECT_TRUE(rebuilt("nothing: the rebuilt cache is reused"));
}

// Runs build_datasets(c) in a child limited to 1 MiB files and 2 GiB of address space (so a build
// that is not refused up front fails small instead of filling the disk or memory); returns the
// child's outcome: "error: <what()>", "other: <what()>" or "built".
std::string build_in_limited_child(const BuilderConfig& c) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const rlimit file{1 << 20, 1 << 20}, memory{std::uint64_t{2} << 30, std::uint64_t{2} << 30};
    ::setrlimit(RLIMIT_FSIZE, &file);
    // Sanitizers reserve terabytes of address space: there the planner's own memory check is what refuses.
    if (!dlm::test::kSanitized) ::setrlimit(RLIMIT_AS, &memory);
    ::signal(SIGXFSZ, SIG_IGN);
    std::string out;
    try {
      build_datasets(c);
      out = "built";
    } catch (const dlm::Error& e) {
      out = std::string("error: ") + e.what();
    } catch (const std::exception& e) {
      out = std::string("other: ") + e.what();
    }
    if (::write(fds[1], out.data(), out.size()) < 0) ::_exit(2);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

// A build whose indices cannot fit the cache's filesystem (every file alone would)
// or, without a cache, memory, is refused before its first byte in one line naming the sizes.
TEST_F(BlendFiles, BuildsThatCannotFitAreRefusedFirst) {
  const auto a = write("a", std::vector<int>(1000, 100));
  const auto b = write("b", std::vector<int>(1000, 100));
  // About 22 bytes a blended sample (document, sample and shuffle index, dataset and sample index).
  struct statvfs vfs{};
  ASSERT_EQ(::statvfs(dir_.c_str(), &vfs), 0);
  const double disk_free = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize);
  auto c = config({"0.5 " + a + " 0.5 " + b}, 8, static_cast<std::int64_t>(1.5 * disk_free / 20));
  const std::string disk = build_in_limited_child(c);
  EXPECT_EQ(disk.find('\n'), std::string::npos) << disk;
  for (const char* part : {"error: ", "/cache: the indices to build need", "train: ", "blended samples", "free",
                           "nothing was written"})
    EXPECT_NE(disk.find(part), std::string::npos) << "'" << part << "' not in: " << disk;
  EXPECT_FALSE(fs::exists(dir_ / "cache") && !fs::is_empty(dir_ / "cache")) << "files left in the cache folder";

  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double available_kib = 0;
  while (meminfo >> key >> available_kib && key != "MemAvailable:") meminfo.ignore(256, '\n');
  ASSERT_EQ(key, "MemAvailable:");
  auto m = config({"0.5 " + a + " 0.5 " + b}, 8, static_cast<std::int64_t>(1.5 * available_kib * 1024 / 20));
  m.gpt.cache_path.reset();
  m.gpt.write_cache = false;
  const std::string memory = build_in_limited_child(m);
  for (const char* part : {"error: ", "need", "of memory", "no cache is written", "available"})
    EXPECT_NE(memory.find(part), std::string::npos) << "'" << part << "' not in: " << memory;
  EXPECT_FALSE(fs::exists(dir_ / "a" / "cache")) << "a cache was written";
}

TEST_F(BlendFiles, BadInputsGiveOneLineErrors) {
  const auto a = write("a", {30, 40, 50});
  const auto b16 = write("b", {30, 40}, DType::kUInt16);
  // Missing prefix.
  expect_error([&] { build_datasets(config({(dir_ / "nope").string()}, 8)); }, {"nope.idx"});
  // Corrupt .idx: a truncated header.
  const auto bad = write("bad", {10, 10});
  fs::resize_file(bad + ".idx", 12);
  expect_error([&] { build_datasets(config({bad}, 8)); }, {"bad.idx"});
  // Missing .bin beside its .idx.
  const auto nobin = write("nobin", {10, 10});
  fs::remove(nobin + ".bin");
  expect_error([&] { build_datasets(config({nobin}, 8)); }, {"nobin.bin"});
  // Corrupt .idx: wrong magic.
  const auto magic = write("magic", {10, 10});
  {
    std::fstream f(magic + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    f.write("XXIDIDX", 7);
  }
  expect_error([&] { build_datasets(config({magic}, 8)); }, {"magic.idx"});
  // Corrupt .bin: shorter than the .idx says.
  const auto short_bin = write("short", {10, 10});
  fs::resize_file(short_bin + ".bin", 30);
  expect_error([&] { build_datasets(config({short_bin}, 8)); }, {"short"});
  // Weights <= 0 or not numbers.
  expect_error([&] { build_datasets(config({"0 " + a + " 1 " + a}, 8)); }, {"--data-path", "weight '0'", "> 0"});
  expect_error([&] { build_datasets(config({"-1 " + a + " 1 " + a}, 8)); }, {"--data-path", "weight '-1'"});
  expect_error([&] { build_datasets(config({"x1 " + a + " 1 " + a}, 8)); }, {"--data-path", "'x1'", "not a number"});
  expect_error([&] { build_datasets(config({"nan " + a + " 1 " + a}, 8)); }, {"weight 'nan'"});
  // Splits summing to 0.
  expect_error([&] { parse_split("0,0,0"); }, {"--split '0,0,0'", "sum to 0"});
  expect_error([&] { parse_split("1,2,3,4"); }, {"4 parts"});
  auto zero_split = config({a}, 8);
  zero_split.split = "0, 0, 0";
  expect_error([&] { build_datasets(zero_split); }, {"--split '0, 0, 0'", "sum to 0"});
  // A split left without documents (megatron-core loops forever on it).
  const auto twenty = write("twenty", std::vector<int>(20, 10));
  auto empty_test = config({twenty}, 8);
  empty_test.split = "969,30,1";
  expect_error([&] { build_datasets(empty_test); }, {"twenty.idx", "test split holds no sequences", "loop forever"});
  // Mismatched dtypes.
  expect_error([&] { build_datasets(config({"1 " + a + " 1 " + b16}, 8)); }, {"b.idx", "uint16", "int32"});
  // Flags.
  MegatronDataArgs m;
  m.data_path = {a};
  m.seq_length = 8;
  m.global_batch_size = 1;
  expect_error([&] { builder_config(m); }, {"--train-samples", "--train-iters"});
}

// --full-validation: the validation split is asked for no sample count (one epoch of it, Megatron's None), the
// others as without the flag; a weighted validation blend, which needs a count, is refused naming the flag.
TEST(MegatronDataArgs, FullValidationAsksOneEpochOfTheValidationSplit) {
  MegatronDataArgs a;
  a.data_path = {"/data/a"};
  a.seq_length = 8;
  a.train_iters = 10;
  a.global_batch_size = 4;
  a.eval_iters = 2, a.eval_interval = 5;
  EXPECT_EQ(megatron_split_request(a)[1], std::optional<std::int64_t>(24));  // (10 / 5 + 1) x 2 x 4
  a.full_validation = true;
  const auto request = megatron_split_request(a);
  EXPECT_EQ(request[0], std::optional<std::int64_t>(40));
  EXPECT_FALSE(request[1].has_value());
  EXPECT_EQ(request[2], std::optional<std::int64_t>(8));
  EXPECT_FALSE(builder_config(a).sizes[1].has_value());
  a.data_path = {"1", "/data/a", "1", "/data/b"};
  expect_error([&] { builder_config(a); }, {"--full-validation", "weighted blend"});
  a.data_path.clear();
  a.train_data_path = {"/data/t"};
  a.valid_data_path = {"/data/a", "/data/b"};  // unweighted: one epoch of each
  EXPECT_FALSE(builder_config(a).sizes[1].has_value());
  a.valid_data_path = {"1", "/data/a", "1", "/data/b"};
  expect_error([&] { builder_config(a); }, {"--full-validation", "weighted blend"});
}

// The tool reports each of these on one line of stderr and exits 1.
TEST_F(BlendFiles, ToolPrintsOneLineErrors) {
  const std::string tool = std::string(DLM_BINARY_DIR) + "/tools/dlm-blend/dlm-blend";
  if (!fs::exists(tool)) GTEST_SKIP() << tool << " is not built";
  const auto a = write("a", {30, 40, 50});
  const std::string common = " --train-samples 10 --global-batch-size 1 --eval-iters 0 --data-cache-path " +
                             (dir_ / "cache").string();
  const std::pair<std::string, std::string> cases[] = {
      {"--seq-length 8 --data-path " + (dir_ / "nope").string() + " --split 1,0,0", "nope.idx"},
      {"--seq-length 8 --data-path '0 " + a + " 1 " + a + "' --split 1,0,0", "weight '0'"},
      {"--seq-length 8 --data-path 'one " + a + " 1 " + a + "' --split 1,0,0", "not a number"},
      {"--seq-length 8 --data-path " + a + " --split 0,0,0", "sum to 0"},
  };
  for (const auto& [flags, expect] : cases) {
    const std::string cmd = tool + " build" + common + " " + flags + " 2>&1 >/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string err;
    char buf[512];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) err.append(buf, n);
    const int status = ::pclose(p);
    EXPECT_EQ(WEXITSTATUS(status), 1) << cmd;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_NE(err.find(expect), std::string::npos) << "'" << expect << "' not in: " << err;
  }
}

}  // namespace
