// Internal: the datasets one run writes (one per json key, or one per key and partition), and their
// removal when the run fails.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "block.h"
#include "dlm/data/indexed_dataset.h"

namespace dlm::data::preprocess_detail {

class OutputSet {
 public:
  OutputSet(const PreprocessOptions& options, DType dtype);
  ~OutputSet();  // without finish(): removes everything this run wrote, temporaries included

  // Writes the block's documents; `first_line` is the global index of the block's first line.
  void write(const EncodedBlock& block, std::uint64_t first_line);
  // Finalizes (and with partitions, merges and removes the partition datasets); fills `outputs`.
  void finish(std::vector<PreprocessOutput>& outputs, std::uint64_t& bytes_out);

 private:
  const PreprocessOptions& options_;
  DType dtype_;
  std::size_t partitions_;  // 1 unless lines are dealt round-robin
  std::vector<std::vector<std::unique_ptr<IndexedDatasetWriter>>> writers_;  // [key][partition]
  std::vector<std::string> finalized_;  // prefixes renamed into place, removed on failure
  bool done_ = false;
};

}  // namespace dlm::data::preprocess_detail
