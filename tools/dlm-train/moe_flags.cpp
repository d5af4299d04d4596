#include "moe_flags.h"

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "flag_checks.h"

namespace po = boost::program_options;

namespace dlm::tools {
namespace {

// --moe-layer-freq: an integer N (layer i is MoE when i % N == 0) or a list "[1,0,1,1]" of one 0/1 per layer.
// Megatron's Python-expression form ("([1]*3+[0]*1)*2") is refused, naming the forms dlm reads.
void layer_frequency(const std::string& v, int num_layers, ckpt::ModelConfig& m) {
  const auto bad = [&] {
    fail(fmt::format("--moe-layer-freq {}: expected an integer N or a list [0/1, ...] of one entry per layer", v));
  };
  if (!v.empty() && v.front() == '[') {
    if (v.back() != ']') bad();
    std::vector<int> pattern;
    std::string word;
    for (char c : v.substr(1, v.size() - 2) + ",") {
      if (c == ' ') continue;
      if (c != ',') {
        word += c;
        continue;
      }
      if (word != "0" && word != "1") bad();
      pattern.push_back(word == "1");
      word.clear();
    }
    if (static_cast<int>(pattern.size()) != num_layers)
      fail(fmt::format("--moe-layer-freq {}: {} entries for --num-layers {}", v, pattern.size(), num_layers));
    m.moe_layer_pattern = std::move(pattern);
    return;
  }
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 6) bad();
  m.moe_layer_freq = std::stoi(v);
  in_range("moe-layer-freq", m.moe_layer_freq, 1, 100000);
}

}  // namespace

void add_moe_flags(po::options_description& group, MoeFlags& f) {
  group.add_options()
      ("num-experts", po::value(&f.num_experts)->default_value(0), "experts per MoE layer (0: a dense model)")
      ("moe-router-topk", po::value(&f.topk)->default_value(f.topk), "experts per token")
      ("moe-ffn-hidden-size", po::value(&f.ffn_hidden_size), "each expert's SwiGLU size (default --ffn-hidden-size)")
      ("moe-shared-expert-intermediate-size", po::value(&f.shared_expert_size)->default_value(0),
       "a shared expert's SwiGLU size: every token runs it beside its routed experts (0: none)")
      ("moe-layer-freq", po::value(&f.layer_freq)->default_value(f.layer_freq),
       "N: layer i is MoE when i % N == 0; or [1,0,...]: one 0/1 per layer")
      ("moe-router-score-function", po::value(&f.score_function)->default_value(f.score_function), "softmax | sigmoid")
      ("moe-router-pre-softmax", po::bool_switch(&f.pre_softmax),
       "softmax over all experts before the top-k, weights not renormalised (HF norm_topk_prob false)")
      ("moe-aux-loss-coeff", po::value(&f.aux_loss_coeff)->default_value(0.0), "switch load-balancing loss, per MoE layer")
      ("moe-z-loss-coeff", po::value(&f.z_loss_coeff)->default_value(0.0), "router z-loss, per MoE layer")
      ("moe-router-load-balancing-type", po::value(&f.load_balancing)->default_value(f.load_balancing),
       "aux_loss (Megatron's switch load-balancing loss; the only one dlm has)")
      ("moe-grouped-gemm", po::bool_switch(&f.grouped_gemm), "accepted: dlm's experts run as one grouped op")
      ("moe-token-dispatcher-type", po::value(&f.dispatcher)->default_value(f.dispatcher),
       "alltoall (one expert-parallel rank: tokens never leave the process)")
      ("moe-expert-capacity-factor", po::value(&f.capacity_factor),
       "each expert keeps at most ceil(tokens x topk / experts x FACTOR) tokens of a micro-batch (default: dropless)")
      ("moe-token-drop-policy", po::value(&f.drop_policy)->default_value(f.drop_policy),
       "probs (an expert over capacity keeps its highest weights) | position (its earliest tokens)")
      ("moe-pad-expert-input-to-capacity", po::bool_switch(&f.pad_to_capacity),
       "accepted with a capacity factor: the results are the same (dlm runs the kept tokens, unpadded)")
      ("moe-shared-expert-overlap", po::bool_switch(&f.shared_expert_overlap),
       "accepted: the same results; dlm runs the shared expert after the routed experts, not during the dispatch")
      ("expert-model-parallel-size", po::value(&f.expert_parallel)->default_value(1),
       "EP: each MoE layer's experts split over EP data-parallel ranks, tokens exchanged by all-to-all")
      ("expert-tensor-parallel-size", po::value(&f.expert_tensor_parallel),
       "each expert split over this many ranks: the --tensor-model-parallel-size (the default) is what dlm offers");
}

void apply_moe_flags(const MoeFlags& f, const po::variables_map& vm, ckpt::ModelConfig& m) {
  in_range("expert-model-parallel-size", f.expert_parallel, 1, 1 << 16);
  if (vm.count("expert-tensor-parallel-size")) in_range("expert-tensor-parallel-size", f.expert_tensor_parallel, 1, 1 << 16);
  if (f.load_balancing != "aux_loss")
    fail(fmt::format("--moe-router-load-balancing-type {}: not supported: dlm offers aux_loss", f.load_balancing));
  if (f.dispatcher != "alltoall")
    fail(fmt::format("--moe-token-dispatcher-type {}: not supported: dlm offers alltoall", f.dispatcher));
  if (f.score_function != "softmax" && f.score_function != "sigmoid")
    fail(fmt::format("--moe-router-score-function {}: not softmax or sigmoid", f.score_function));
  in_range("num-experts", f.num_experts, 0, 1 << 16);
  in_range("moe-router-topk", f.topk, 1, 1 << 16);
  in_range("moe-aux-loss-coeff", f.aux_loss_coeff, 0, 1e6);
  in_range("moe-z-loss-coeff", f.z_loss_coeff, 0, 1e6);
  if (vm.count("moe-ffn-hidden-size")) in_range("moe-ffn-hidden-size", f.ffn_hidden_size, 1, 1 << 22);
  if (f.drop_policy != "probs" && f.drop_policy != "position")
    fail(fmt::format("--moe-token-drop-policy {}: expected probs or position", f.drop_policy));
  if (vm.count("moe-expert-capacity-factor")) in_range("moe-expert-capacity-factor", f.capacity_factor, 1e-6, 1e6);
  if (f.pad_to_capacity && !vm.count("moe-expert-capacity-factor"))
    fail("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (as in Megatron)");
  in_range("moe-shared-expert-intermediate-size", f.shared_expert_size, 0, 1 << 22);
  if (f.shared_expert_overlap && f.shared_expert_size == 0)
    fail("--moe-shared-expert-overlap needs --moe-shared-expert-intermediate-size (as in Megatron)");
  if (f.num_experts == 0 && f.expert_parallel > 1)
    fail(fmt::format("--expert-model-parallel-size {} needs --num-experts (a mixture-of-experts model)", f.expert_parallel));
  if (f.num_experts > 0 && f.num_experts % f.expert_parallel != 0)
    fail(fmt::format("--expert-model-parallel-size {} does not divide --num-experts {}", f.expert_parallel, f.num_experts));
  if (f.num_experts == 0) {
    // A dense model: the MoE flags change nothing, but a malformed value is still refused.
    ckpt::ModelConfig unused = m;
    layer_frequency(f.layer_freq, m.num_layers, unused);
    return;
  }
  if (f.topk > f.num_experts)
    fail(fmt::format("--moe-router-topk {} is more than --num-experts {}", f.topk, f.num_experts));
  m.num_experts = f.num_experts;
  m.moe_router_topk = f.topk;
  m.moe_ffn_hidden_size = vm.count("moe-ffn-hidden-size") ? f.ffn_hidden_size : m.ffn_hidden_size;
  m.moe_shared_expert_intermediate_size = f.shared_expert_size;
  layer_frequency(f.layer_freq, m.num_layers, m);
  const bool sigmoid = f.score_function == "sigmoid";
  m.moe_router_score_function = sigmoid ? ckpt::MoeScoreFunction::kSigmoid : ckpt::MoeScoreFunction::kSoftmax;
  // Megatron renormalises the top-k of a sigmoid router when k > 1, of a softmax one unless --moe-router-pre-softmax.
  m.moe_norm_topk_prob = sigmoid ? f.topk > 1 : !f.pre_softmax;
  m.moe_aux_loss_coeff = f.aux_loss_coeff;
  m.moe_z_loss_coeff = f.z_loss_coeff;
  m.moe_expert_capacity_factor = vm.count("moe-expert-capacity-factor") ? f.capacity_factor : 0.0;
  m.moe_token_drop_policy = f.drop_policy == "position" ? ckpt::MoeDropPolicy::kPosition : ckpt::MoeDropPolicy::kProbs;
}

void check_expert_tensor_parallel(const MoeFlags& f, int tensor_parallel) {
  if (f.expert_tensor_parallel != 0 && f.expert_tensor_parallel != tensor_parallel)
    fail(fmt::format("--expert-tensor-parallel-size {}: not supported: dlm splits each expert over the tensor-parallel "
                     "group (--tensor-model-parallel-size {}, megatron-core's default)", f.expert_tensor_parallel,
                     tensor_parallel));
}

}  // namespace dlm::tools
