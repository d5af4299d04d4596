// libFuzzer: dlm-train's argument parser on an argv made of the input's NUL-separated parts. Usage
// errors are boost::program_options errors, bad values dlm::Error; nothing else may escape.
#include <cstdint>
#include <string>
#include <vector>

#include <boost/program_options/errors.hpp>

#include "dlm/common/error.h"
#include "fuzz_util.h"
#include "train_args.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto parts = dlm::fuzz::split_parts(data, size, 64);
  std::vector<char*> argv{const_cast<char*>("dlm-train")};
  for (auto& p : parts) argv.push_back(p.data());
  argv.push_back(nullptr);
  try {
    (void)dlm::tools::parse_train_args(static_cast<int>(argv.size() - 1), argv.data());
  } catch (const boost::program_options::error&) {
  } catch (const dlm::Error&) {
  }
  return 0;
}
