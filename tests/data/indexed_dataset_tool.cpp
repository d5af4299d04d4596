// Test driver for the interop tests: writes a dataset with libdata from a JSON-lines description,
// or dumps one as JSON lines, so Python can compare it with megatron-core's IndexedDataset.
//   indexed_dataset_tool write PREFIX DTYPE_CODE < docs.jsonl   (each line: [[ids...], [ids...]] = one document)
//   indexed_dataset_tool dump PREFIX                             (prints {"sequences":[...],"documents":[...]})
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "dlm/data/indexed_dataset.h"

int main(int argc, char** argv) {
  using namespace dlm::data;
  try {
    std::string mode = argc > 2 ? argv[1] : "";
    if (mode == "write" && argc == 4) {
      IndexedDatasetWriter w(argv[2], dtype_from_code(static_cast<std::uint8_t>(std::stoi(argv[3]))));
      std::string line;
      while (std::getline(std::cin, line)) {
        auto doc = nlohmann::json::parse(line);
        for (const auto& seq : doc) {
          std::vector<std::int32_t> ids = seq.get<std::vector<std::int32_t>>();
          w.add_item(ids);
        }
        w.end_document();
      }
      w.finalize();
      return 0;
    }
    if (mode == "dump" && argc == 3) {
      IndexedDataset ds(argv[2]);
      ds.validate();
      nlohmann::json out;
      out["dtype"] = static_cast<int>(ds.dtype());
      out["sequences"] = nlohmann::json::array();
      for (std::size_t i = 0; i < ds.num_sequences(); ++i) out["sequences"].push_back(ds.sequence(i));
      out["document_indices"] = ds.document_indices().to_vector();
      std::cout << out.dump() << "\n";
      return 0;
    }
    std::cerr << "usage: indexed_dataset_tool write PREFIX DTYPE_CODE < docs.jsonl | dump PREFIX\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "indexed_dataset_tool: " << e.what() << "\n";
    return 1;
  }
}
