// The part of Megatron-LM's (and MegaDLMs') argument surface that dlm-train does not map onto a library option:
// flags accepted because they state what dlm already does (validated: --normalization RMSNorm passes,
// --normalization LayerNorm fails naming the flag and value), flags accepted that change nothing in dlm (listed
// as such by --help and named in one start-up line), and flags refused with one line naming what dlm offers
// instead. docs/megatron-compat.md has the table; tests/train_tool/megatron_compat_test.cpp checks every row.
//
// Repeats: Megatron's argparse lets the last occurrence of a flag win, so scripts override a shape by appending
// flags. dlm-train does the same (last_occurrence_wins) instead of Boost's "specified more than once".
#pragma once

#include <string>
#include <vector>

#include <boost/program_options.hpp>

namespace dlm::tools {

// Registers the three groups (as-is, no effect, refused); their values are read back from the variables_map.
void add_megatron_surface(boost::program_options::options_description& as_is,
                          boost::program_options::options_description& no_effect,
                          boost::program_options::options_description& refused);
// After notify: throws dlm::Error, one line naming the flag, for a refused flag or an as-is flag whose value asks
// for something dlm does not do.
void check_megatron_surface(const boost::program_options::variables_map& vm);
// The start-up line naming the flags given that change nothing in dlm ("" when none).
std::string no_effect_notice(const boost::program_options::variables_map& vm);

// argv without the earlier occurrences of a repeated option (an option with its values: the tokens after it up
// to the next one that starts with "-" and is not a number). Argument 0 is kept.
std::vector<std::string> last_occurrence_wins(int argc, char** argv);

}  // namespace dlm::tools
