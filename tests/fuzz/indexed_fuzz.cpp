// libFuzzer: a Megatron .idx with a .bin beside it, run through every reader of the tools. Input: 4 bytes
// (the .bin size, little-endian, capped at 64 KiB) then the .idx. Opening must reject with dlm::Error or
// give a dataset that every reader handles with dlm::Error at worst: validate and the reads it vouches
// for, inspect (dlm-preprocess inspect), append (merge), the token range (dlm-train's data check), and a
// GPTDataset index built over it with its samples read (dlm-blend build and sample, dlm-train's batches).
#include <cstdint>
#include <cstring>
#include <string>

#include "dlm/common/error.h"
#include "dlm/data/blend.h"
#include "dlm/data/blend_args.h"
#include "dlm/data/indexed_dataset.h"
#include "dlm/data/preprocess_inspect.h"
#include "dlm/data/sample_reader.h"
#include "fuzz_util.h"

namespace {

// Each reader on its own: one refusing must not hide a crash in the next.
template <typename F>
void reader(F&& f) {
  try {
    f();
  } catch (const dlm::Error&) {
  }
}

void blend_and_sample(const std::string& prefix) {
  dlm::data::MegatronDataArgs args;
  args.data_path = {prefix};
  args.split = "100,0,0";
  args.seq_length = 3;
  args.train_samples = 8;
  args.global_batch_size = 1;
  dlm::data::BuilderConfig config = dlm::data::builder_config(args);
  config.gpt.write_cache = false;  // in memory: each input is a fresh build
  const auto splits = dlm::data::build_datasets(config);
  if (!splits[0]) return;
  dlm::data::SampleReader samples(*splits[0], {});
  for (std::size_t i = 0; i < samples.size() && i < 16; ++i) (void)samples.read(i);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  std::uint32_t bin_size = 0;
  std::memcpy(&bin_size, data, 4);
  bin_size %= 65536;
  dlm::fuzz::write_temp("d.idx", {reinterpret_cast<const char*>(data + 4), size - 4});
  std::string bin(bin_size, '\0');
  for (std::size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<char>(i * 31);
  dlm::fuzz::write_temp("d.bin", bin);
  const auto prefix = dlm::fuzz::temp_path("d");
  reader([&] {
    dlm::data::IndexedDataset ds(prefix);
    if (ds.num_sequences()) (void)ds.sequence_bytes(ds.num_sequences() - 1);  // promised inside .bin
    ds.validate();
    for (std::size_t i = 0; i < ds.num_sequences(); ++i) (void)ds.sequence(i);
    for (std::size_t d = 0; d < ds.num_documents(); ++d) (void)ds.document(d);
  });
  reader([&] {
    dlm::data::IndexedDataset ds(prefix);
    const auto stats = dlm::data::inspect_dataset(ds, 5);
    (void)dlm::data::format_stats(ds, stats, nullptr, 2);
  });
  reader([&] {
    dlm::data::IndexedDataset ds(prefix);
    (void)dlm::data::token_range(ds);
  });
  reader([&] {
    dlm::data::IndexedDataset ds(prefix);
    dlm::data::IndexedDatasetWriter merged(dlm::fuzz::temp_path("merged"), ds.dtype());
    merged.append(prefix);  // never finalized: its temporary is removed
  });
  reader([&] { blend_and_sample(prefix); });
  return 0;
}
