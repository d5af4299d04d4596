#include "cuda_flags.h"

#include <string>

namespace dlm::tools {

void add_cuda_flags(boost::program_options::options_description& opts, train::CudaOptions& o, CudaFlagsFor use) {
  namespace po = boost::program_options;
  using Attention = train::CudaOptions::Attention;
  opts.add_options()
      ("deterministic-mode", po::bool_switch(&o.deterministic),
       "GPU: bitwise-repeatable runs: cuDNN's deterministic attention backward, no GEMM autotuning (slower)")
      ("cuda-attention",
       po::value<std::string>()->default_value("cudnn")->notifier([&o](const std::string& v) {
         if (v != "cudnn" && v != "own") throw po::error("--cuda-attention: '" + v + "' is not cudnn or own");
         o.attention = v == "own" ? Attention::kOwn : Attention::kCudnn;
       }),
       "GPU attention kernels: cudnn (cuDNN's fused attention; dlm's own where cuDNN refuses a shape) | own (dlm's "
       "kernels, the reference the tests hold cuDNN to; slower)");
  if (use == CudaFlagsFor::kTraining) {
    opts.add_options()("cuda-profile", po::bool_switch(&o.profile),
                       "GPU: time each phase of a step with CUDA events and print the table at the end (synchronises "
                       "the stream each phase: slower steps)");
  } else {
    opts.add_options()("no-cuda-graphs", po::bool_switch()->notifier([&o](bool off) { o.cuda_graphs = !off; }),
                       "GPU: launch each sampling forward's kernels one by one instead of replaying a captured CUDA "
                       "graph (slower; for debugging)")
                      ("fp8", po::bool_switch(&o.fp8_sampling),
                       "GPU: the layers' QKV, projection and MLP GEMMs and the output layer in FP8 e4m3 (weights cast "
                       "once at load, inputs scaled per forward; embedding, norms and attention in bf16; "
                       "docs/generation.md)");
  }
}

}  // namespace dlm::tools
