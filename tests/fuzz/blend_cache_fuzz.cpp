// libFuzzer: a reused dlm-blend / megatron-core index cache, damaged, through every reader that reuses it.
//
// Once per process: two small datasets (a, b) and the cache of one blend over them ("0.3 a 0.7 b",
// split 70,20,10: three GPTDatasets per dataset and a BlendedDataset per split, each with its
// description, .npy arrays and checksums.dlm), built by the library: the pristine set of 42 files, in
// the order of (a, b, blend) x (test, train, valid) x file name: 0-14 a's GPTDataset files (checksums,
// description, document_index, sample_index, shuffle_index per split), 15-29 b's, 30-41 the blends'
// (checksums, dataset_index, dataset_sample_index, description per split). Input: one flag byte (bit 0: rebuilding is off, as a cache that must be reused; bit 1:
// the sample options reset positions and masks), then up to 8 edits, each an op byte and a file byte
// (mod the number of files):
//   op 0  overwrite: u16 offset (mod size + 8), u8 count, then that many bytes (the file grows if needed)
//   op 1  truncate to u16 (mod size + 1) bytes
//   op 2  replace with the next u16 (capped) bytes
//   op 3  copy another file (one more file byte) over it: right-shaped arrays of the wrong split or dataset
// Each input runs twice: with the edited checksums.dlm files, and with every checksums.dlm removed
// (megatron-core's caches have none: the invariants alone must protect the readers). Each run loads or
// rebuilds every split as dlm-blend build / inspect and dlm-train do, prints the inspect report, and
// reads every sample through SampleReader (dlm-blend sample, dlm-train's batches). It must end in a
// reuse, a rebuild, or one dlm::Error of one line; and then
//   - a second build over what the first left reuses every index and reads the same samples;
//   - with checksums kept and no checksums.dlm edited, the samples are the pristine cache's.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dlm/common/error.h"
#include "dlm/common/log.h"
#include "dlm/data/blend.h"
#include "dlm/data/blend_args.h"
#include "dlm/data/indexed_dataset.h"
#include "dlm/data/sample_reader.h"
#include "fuzz_util.h"

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxFile = 1 << 16;
constexpr int kMaxEdits = 8;

std::string g_cache;                                // the cache folder
std::vector<std::pair<std::string, std::string>> g_files;  // pristine (name, bytes), in a fixed order

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& name, const std::string& bytes) {
  std::ofstream(g_cache + "/" + name, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void write_dataset(const std::string& prefix, int sequences, int seed) {
  dlm::data::IndexedDatasetWriter w(prefix, dlm::data::DType::kUInt16);
  for (int s = 0; s < sequences; ++s) {
    std::vector<std::int32_t> tokens;
    for (int t = 0; t < 1 + (s * seed) % 7; ++t) tokens.push_back(100 * seed + 10 * s + t);
    w.add_item(tokens);
    w.end_document();
  }
  w.finalize();
}

dlm::data::BuilderConfig config(bool rebuild) {
  const dlm::data::MegatronDataArgs args{
      .data_path = {"0.3", dlm::fuzz::temp_path("a"), "0.7", dlm::fuzz::temp_path("b")}, .split = "70,20,10",
      .seq_length = 4, .train_samples = 24, .global_batch_size = 2, .eval_iters = 2, .eval_interval = 12,
      .data_cache_path = g_cache};
  auto c = dlm::data::builder_config(args);
  c.gpt.write_cache = rebuild;
  return c;
}

// Every sample of every split (tokens then labels); none when a reader refused.
using Samples = std::vector<std::vector<std::int32_t>>;

// The tools print each error as one line: a control byte (a newline, a carriage return) in its
// message aborts.
void check_one_line(const dlm::Error& e) {
  for (const char* c = e.what(); *c; ++c)
    if (static_cast<unsigned char>(*c) < 0x20) {
      std::fprintf(stderr, "dlm::Error with control byte %d: %s\n", *c, e.what());
      std::abort();
    }
}

std::vector<std::vector<std::int32_t>> g_pristine[2];  // per sample options: every sample's tokens + labels

struct Run {
  std::optional<Samples> samples;
  bool all_reused = true;
};

Run read_everything(bool rebuild, const dlm::data::SampleOptions& options) {
  Run run;
  try {
    const auto splits = dlm::data::build_datasets(config(rebuild));
    (void)dlm::data::inspect_report(splits);
    Samples samples;
    for (const auto& split : splits) {
      if (!split) continue;
      run.all_reused = run.all_reused && (!split->blended || split->loaded_from_cache);
      for (const auto& d : split->datasets) run.all_reused = run.all_reused && d->loaded_from_cache();
      dlm::data::SampleReader reader(*split, options);
      for (std::size_t i = 0; i < reader.size(); ++i) {
        auto s = reader.read(i);
        s.tokens.insert(s.tokens.end(), s.labels.begin(), s.labels.end());
        samples.push_back(std::move(s.tokens));
      }
    }
    run.samples = std::move(samples);
  } catch (const dlm::Error& e) {
    check_one_line(e);
  }
  return run;
}

void restore_pristine() {
  std::set<std::string> names;
  for (const auto& [name, bytes] : g_files) {
    write_all(name, bytes);
    names.insert(name);
  }
  for (const auto& entry : fs::directory_iterator(g_cache))  // whatever a rebuild left beside them
    if (!names.count(entry.path().filename().string())) fs::remove_all(entry.path());
}

bool is_checksums(std::size_t file) { return g_files[file].first.ends_with("checksums.dlm"); }

// Applies the edits to the cache folder; returns whether any touched a checksums.dlm.
bool apply_edits(const std::uint8_t* p, std::size_t n) {
  std::size_t at = 0;
  auto byte = [&]() -> unsigned { return at < n ? p[at++] : 0; };
  auto u16 = [&]() -> std::size_t { const unsigned lo = byte(); return lo | (byte() << 8); };
  std::vector<std::string> files;
  for (const auto& f : g_files) files.push_back(f.second);
  bool checksums_edited = false;
  for (int e = 0; e < kMaxEdits && at < n; ++e) {
    const unsigned op = byte() % 4;
    const std::size_t f = byte() % files.size();
    std::string& bytes = files[f];
    if (op == 0) {
      const std::size_t offset = u16() % (bytes.size() + 8);
      std::size_t count = byte();
      count = std::min(count, n - at);
      if (offset + count > bytes.size()) bytes.resize(offset + count, '\0');
      std::memcpy(bytes.data() + offset, p + at, count);
      at += count;
    } else if (op == 1) {
      bytes.resize(u16() % (bytes.size() + 1));
    } else if (op == 2) {
      const std::size_t count = std::min({u16(), n - at, kMaxFile});
      bytes.assign(reinterpret_cast<const char*>(p + at), count);
      at += count;
    } else {
      bytes = files[byte() % files.size()];
    }
    checksums_edited = checksums_edited || is_checksums(f);
  }
  for (std::size_t f = 0; f < files.size(); ++f)
    if (files[f] != g_files[f].second) write_all(g_files[f].first, files[f]);
  return checksums_edited;
}

dlm::data::SampleOptions sample_options(unsigned flags) {
  dlm::data::SampleOptions options;
  options.eod = 300;  // the first token of dataset a
  if (flags & 2) {
    options.pad = 0;
    options.reset_position_ids = options.reset_attention_mask = options.eod_mask_loss = true;
  }
  return options;
}

void check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "blend_cache_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Every input rewrites the cache files: on tmpfs (unless TMPDIR says otherwise), not a disk's flushes.
  if (fs::is_directory("/dev/shm")) ::setenv("TMPDIR", "/dev/shm", 0);
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(fs::path(dlm::fuzz::temp_path("a")).parent_path(), ec);
  });
  // Every rebuild warns, thousands of lines a second; DLM_LOG_LEVEL=warning shows them (replaying an input).
  if (!std::getenv("DLM_LOG_LEVEL")) dlm::log::set_level(dlm::log::Level::kError);
  g_cache = dlm::fuzz::temp_path("cache");
  fs::remove_all(g_cache);
  fs::create_directories(g_cache);
  write_dataset(dlm::fuzz::temp_path("a"), 23, 3);
  write_dataset(dlm::fuzz::temp_path("b"), 17, 5);
  for (int o = 0; o < 2; ++o) {
    const Run pristine = read_everything(true, sample_options(o * 2));
    check(pristine.samples.has_value(), "the pristine cache cannot be built");
    g_pristine[o] = *pristine.samples;
  }
  // Ordered by what each file is, not by its hash (which holds this process's temp path): an input
  // names the same file in every process.
  std::map<std::string, std::string> owner;  // hash -> "a", "b" or "blend"
  for (const auto& entry : fs::directory_iterator(g_cache)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with("description.txt")) continue;
    const std::string text = read_all(entry.path());
    owner[name.substr(0, name.find('-'))] = text.find("\"class\": \"BlendedDataset\"") != std::string::npos ? "blend"
                                            : text.find(dlm::fuzz::temp_path("a") + "\"") != std::string::npos ? "a"
                                                                                                              : "b";
  }
  std::map<std::string, std::pair<std::string, std::string>> ordered;
  for (const auto& entry : fs::directory_iterator(g_cache)) {
    const std::string name = entry.path().filename().string();
    const auto dash = name.find('-');
    ordered[owner[name.substr(0, dash)] + name.substr(dash)] = {name, read_all(entry.path())};
  }
  for (auto& [key, file] : ordered) g_files.push_back(std::move(file));
  check(g_files.size() == 6 * 5 + 3 * 4, "expected 6 GPTDataset caches of 5 files and 3 blend caches of 4");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool rebuild = (data[0] & 1) == 0;
  const auto options = sample_options(data[0]);
  for (const bool keep_checksums : {true, false}) {
    restore_pristine();
    const bool checksums_edited = apply_edits(data + 1, size - 1);
    if (!keep_checksums)
      for (const auto& [name, bytes] : g_files)
        if (name.ends_with("checksums.dlm")) fs::remove(g_cache + "/" + name);
    const Run first = read_everything(rebuild, options);
    if (!first.samples) continue;
    if (keep_checksums && !checksums_edited)
      check(*first.samples == g_pristine[(data[0] >> 1) & 1],
            "a cache its checksums vouch for gave other samples than the pristine one");
    if (!rebuild) {  // every file exists, so a build without rebuilding reused them all
      check(first.all_reused, "a cache was rebuilt while rebuilding is off");
      continue;
    }
    const Run second = read_everything(rebuild, options);
    check(second.samples.has_value(), "the cache a rebuild left is refused");
    check(second.all_reused, "the cache a rebuild left is not reused");
    check(*second.samples == *first.samples, "the reused cache gives other samples than the build that left it");
  }
  return 0;
}
