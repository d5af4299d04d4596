// Megatron's data-argument files (training/utils.py, get_blend_and_blend_per_split): the --data-path words kept in
// a file when the list is too long for a command line.
//   --data-args-path FILE            the file's whitespace-separated words are --data-path's
//   --per-split-data-args-path FILE  JSON {"train": ..., "valid": ..., "test": ...}, each a string (split on
//                                    whitespace) or a list of words: --train-data-path, --valid-data-path and
//                                    --test-data-path; null leaves that split out (all three keys must be there)
// Errors are one line naming the file and what was expected (a missing file, bad JSON and where, a missing key).
#pragma once

#include <array>
#include <string>
#include <vector>

namespace dlm::tools {

std::vector<std::string> read_data_args(const std::string& path);
// train, valid, test.
std::array<std::vector<std::string>, 3> read_per_split_data_args(const std::string& path);

}  // namespace dlm::tools
