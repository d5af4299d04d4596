// Writes and reads back a dataset and checks a model config through the installed dlm libraries.
#include <cstdio>
#include <vector>

#include "dlm/ckpt/model_config.h"
#include "dlm/data/indexed_dataset.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  dlm::data::IndexedDatasetWriter w(argv[1], dlm::data::DType::kUInt16);
  std::vector<std::int32_t> doc{5, 6, 7};
  w.add_item(doc);
  w.end_document();
  w.finalize();
  dlm::data::IndexedDataset ds(argv[1]);
  dlm::ckpt::ModelConfig config;
  config.validate();
  bool ok = ds.sequence(0) == doc && !dlm::ckpt::model_tensors(config).empty();
  std::puts(ok ? "consumer: ok" : "consumer: wrong");
  return ok ? 0 : 1;
}
