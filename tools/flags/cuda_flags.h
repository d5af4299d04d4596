// The CUDA backend's choices a user makes (CudaOptions, include/dlm/train/cuda_options.h) as flags of dlm-train
// and dlm-generate. Every build takes them; on the CPU backend they change nothing.
#pragma once

#include <boost/program_options.hpp>

#include "dlm/train/cuda_options.h"

namespace dlm::tools {

enum class CudaFlagsFor { kTraining, kSampling };

// Both tools: --deterministic-mode, --cuda-attention cudnn|own. Training adds --cuda-profile (the phase table of
// a training step); sampling adds --no-cuda-graphs (graphs capture the sampling forwards only) and --fp8
// (CudaOptions::fp8_sampling). Parsing fills
// `options`; an unknown --cuda-attention is a boost::program_options::error (a usage error).
void add_cuda_flags(boost::program_options::options_description& opts, train::CudaOptions& options, CudaFlagsFor use);

}  // namespace dlm::tools
