// libFuzzer: a Megatron .idx with a .bin beside it. Input: 4 bytes (the .bin size, little-endian,
// capped at 64 KiB) then the .idx. Opening must reject with dlm::Error or give a dataset whose
// validate() either throws dlm::Error or vouches for every sequence and document read below.
#include <cstdint>
#include <cstring>
#include <string>

#include "dlm/common/error.h"
#include "dlm/data/indexed_dataset.h"
#include "fuzz_util.h"

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
  try {
    dlm::data::IndexedDataset ds(prefix);
    if (ds.num_sequences()) (void)ds.sequence_bytes(ds.num_sequences() - 1);  // promised inside .bin
    ds.validate();
    for (std::size_t i = 0; i < ds.num_sequences(); ++i) (void)ds.sequence(i);
    for (std::size_t d = 0; d < ds.num_documents(); ++d) (void)ds.document(d);
  } catch (const dlm::Error&) {
  }
  return 0;
}
