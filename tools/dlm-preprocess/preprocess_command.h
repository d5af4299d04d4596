// The preprocessing command of dlm-preprocess (its flags and run), apart from the small subcommands.
#pragma once

#include <string>
#include <vector>


namespace dlm::tools {

// Parses Megatron's flags, runs the pipeline, prints the summary. Throws po::error on usage errors.
int run_preprocess(const std::vector<std::string>& args);

}  // namespace dlm::tools
