// MegaDLMs' variable-length draw, through libdata's numpy legacy RandomState (issue 5).
#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/objective.h"

#if __has_include("dlm/data/numpy_random.h")
#include "dlm/data/numpy_random.h"
#define DLM_HAVE_NUMPY_RANDOM 1
#endif

namespace dlm::train {

std::int64_t variable_length(double prob, std::uint64_t seed, std::int64_t length) {
  if (prob <= 0 || length <= 2) return length;
#ifdef DLM_HAVE_NUMPY_RANDOM
  // TODO(issue 7): wire to libdata's RandomState once its API lands.
  fail("--difflm-varilen-prob: numpy RandomState wiring pending");
#else
  fail(fmt::format("--difflm-varilen-prob {}: needs libdata's numpy RandomState (not built); use 0", prob));
#endif
}

}  // namespace dlm::train
