// The parallel layer's pieces that need no second process: the launcher's rank variables, Megatron's
// rank order and groups, the group of one, and the dry run's numbers against hand-computed values.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <numeric>
#include <string>

#include "dlm/common/error.h"
#include "dlm/train/cuda_memory_plan.h"
#include "dlm/train/parallel.h"
#include "dlm/train/parallel_plan.h"
#include "dlm/train/pipeline_schedule.h"
#include "expert_dispatch_plan.h"
#include "grad_buffer.h"

namespace dlm::train {
namespace {

std::map<std::string, std::string> g_env;
const char* fake_getenv(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

TEST(LaunchInfo, ReadsMpirunSrunAndNothing) {
  g_env = {};
  EXPECT_EQ(launch_info(fake_getenv).world_size, 1);
  EXPECT_EQ(launch_info(fake_getenv).launcher, "none");
  g_env = {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}};
  auto s = launch_info(fake_getenv);
  EXPECT_EQ(s.rank, 5);
  EXPECT_EQ(s.world_size, 8);
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.launcher, "srun");
  // mpirun inside a Slurm allocation: mpirun's variables are this process's.
  g_env["OMPI_COMM_WORLD_RANK"] = "3";
  g_env["OMPI_COMM_WORLD_SIZE"] = "4";
  g_env["OMPI_COMM_WORLD_LOCAL_RANK"] = "3";
  s = launch_info(fake_getenv);
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.world_size, 4);
  EXPECT_EQ(s.launcher, "mpirun");
  g_env = {{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}};
  EXPECT_THROW(launch_info(fake_getenv), Error);
  g_env = {{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}};
  EXPECT_THROW(launch_info(fake_getenv), Error);
}

TEST(LaunchInfo, ReadsTorchrunOnlyWhenTorchrunStartedTheProcess) {
  // RANK/WORLD_SIZE alone (an env:// launch without torchrun's agent) are no launcher dlm can join.
  g_env = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}};
  EXPECT_EQ(launch_info(fake_getenv).launcher, "none");
  g_env["TORCHELASTIC_RUN_ID"] = "abc";
  auto s = launch_info(fake_getenv);
  EXPECT_EQ(s.launcher, "torchrun");
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.world_size, 2);
  EXPECT_EQ(s.local_rank, 1);
  // `srun torchrun`: the workers inherit srun's variables, torchrun's are theirs.
  g_env["SLURM_PROCID"] = "0";
  g_env["SLURM_NTASKS"] = "1";
  EXPECT_EQ(launch_info(fake_getenv).launcher, "torchrun");
  EXPECT_EQ(launch_info(fake_getenv).world_size, 2);
}

// megatron.core.parallel_state's example: 16 GPUs, TP 2, PP 4 -> DP 2; tensor groups [g0, g1],
// [g2, g3], ...; data groups [g0, g2], [g1, g3], [g4, g6], ...; pipeline groups [g0, g4, g8, g12], ...
TEST(RankOrder, IsMegatrons) {
  const auto c = derive_parallel_config(16, 2, 4);
  EXPECT_EQ(c.data, 2);
  EXPECT_EQ(tensor_parallel_ranks(c, 3), (std::vector<int>{2, 3}));
  EXPECT_EQ(data_parallel_ranks(c, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(data_parallel_ranks(c, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(pipeline_parallel_ranks(c, 1), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(rank_coords(c, 13), (RankCoords{1, 0, 3}));
  for (int r = 0; r < 16; ++r) EXPECT_EQ(global_rank(c, rank_coords(c, r)), r);
}

TEST(RankOrder, SizesThatDoNotDivideNameTheFlags) {
  try {
    derive_parallel_config(12, 8, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("12 ranks are not a multiple of --tensor-model-parallel-size 8"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(derive_parallel_config(4, 0, 1), Error);
}

TEST(Communicator, GroupOfOneCopiesAndSplits) {
  auto c = make_single_process_communicator();
  std::vector<float> in = {1, 2, 3}, out(3);
  c->reduce_scatter<float>(in, out);
  EXPECT_EQ(out, in);
  c->all_reduce<float>(out);
  EXPECT_EQ(out, in);
  std::vector<float> two(6);
  EXPECT_THROW(c->all_gather<float>(in, two), Error);  // 6 elements are not 1 block of 3
  auto groups = make_process_groups(*c, derive_parallel_config(1, 1, 1));
  EXPECT_EQ(groups.data->size(), 1);
}

// Tensors of 7, 300, 5, 64 and 1 elements.
struct FakeParams {
  std::vector<std::vector<float>> values, grads;
  std::vector<ParamRef> refs;
  FakeParams() {
    for (std::size_t n : {7u, 300u, 5u, 64u, 1u}) values.emplace_back(n), grads.emplace_back(n);
    for (std::size_t t = 0; t < values.size(); ++t) {
      std::iota(values[t].begin(), values[t].end(), 1000.0f * static_cast<float>(t));
      refs.push_back(ParamRef{"t" + std::to_string(t), values[t], grads[t], t % 2 == 0, {}});
    }
  }
};

TEST(GradBuffer, EveryElementHasExactlyOneOwnerAndBucketsAreWholeTensors) {
  FakeParams p;
  for (const int dp : {1, 3, 4}) {
    std::map<std::pair<std::string, const float*>, int> owners;
    for (int r = 0; r < dp; ++r) {
      GradBuffer buffer(p.refs, dp, r, 100);
      // In reverse order, a bucket closes at the first tensor boundary past 100 elements:
      // 1 + 64 + 5 + 300 | 7, each padded to a multiple of DP.
      ASSERT_EQ(buffer.buckets().size(), 2u);
      for (const auto& b : buffer.buckets()) EXPECT_EQ(b.size % static_cast<std::size_t>(dp), 0u);
      EXPECT_EQ(buffer.buckets()[0].size, (370u + dp - 1) / dp * dp);
      EXPECT_EQ(buffer.buckets()[1].offset, buffer.buckets()[0].size);
      for (const auto& piece : buffer.shard_params(p.refs)) {
        EXPECT_EQ(piece.grad.size(), piece.value.size());
        for (float& x : piece.value) ++owners[{piece.name, &x}];
      }
    }
    EXPECT_EQ(owners.size(), 7u + 300 + 5 + 64 + 1) << "DP " << dp;
    for (const auto& [element, count] : owners) EXPECT_EQ(count, 1);
  }
}

TEST(GradBuffer, ShardedMomentsGoBackToWholeTensors) {
  FakeParams p;
  auto single = make_single_process_communicator();
  GradBuffer buffer(p.refs, 1, 0, 50);
  AdamW whole({});
  whole.set_steps(3);
  for (const auto& v : p.values) {
    whole.exp_avg().push_back(v);
    whole.exp_avg_sq().emplace_back(v.size(), 2.0f);
  }
  const AdamW shard = buffer.shard_optimizer(whole, p.refs);
  EXPECT_EQ(shard.exp_avg().size(), buffer.shard_params(p.refs).size());
  const AdamW back = buffer.gather_optimizer(shard, p.refs, *single);
  EXPECT_EQ(back.steps(), 3);
  EXPECT_EQ(back.exp_avg(), whole.exp_avg());
  EXPECT_EQ(back.exp_avg_sq(), whole.exp_avg_sq());
}

// 4 layers, hidden 64, FFN 128, 4 heads of 16 in 2 KV groups, vocabulary 256, tied; TP 2 (SP), PP 2,
// DP 2, distributed optimizer, bf16, micro-batch 2, global batch 16, sequence 32. Every number below is
// worked by hand in docs/parallelism.md ("A check by hand").
std::string units(const std::vector<train::PipelineUnit>& order) {
  std::string out;
  for (const auto& u : order) out += fmt::format("{}{}.{} ", u.forward ? 'F' : 'B', u.chunk, u.micro_batch);
  return out;
}

// The GPU expert dispatch's host plan on EP2, 4 experts (2 local): this rank routes 3, 0, 2, 1 rows to experts 0-3;
// rank 0 (itself) sends it 1 and 2 rows for its local experts 0 and 1, rank 1 sends 3 and 0. Received rows 0 | 1-2 |
// 3-5 are (rank 0, expert 0) | (rank 0, expert 1) | (rank 1, expert 0); expert 0's rows are received 0, 3, 4, 5.
TEST(ExpertDispatchPlan, PermutesTheReceivedRowsToLocalExpertOrder) {
  const std::vector<int> mine = {3, 0, 2, 1}, got = {1, 2, 3, 0};
  const ExpertDispatchPlan p = plan_expert_dispatch(mine, got, 2);
  EXPECT_EQ(p.send, (std::vector<std::int64_t>{3, 3}));
  EXPECT_EQ(p.recv, (std::vector<std::int64_t>{3, 3}));
  EXPECT_EQ(p.received, 6);
  EXPECT_EQ(p.perm, (std::vector<int>{0, 3, 4, 5, 1, 2}));
  EXPECT_EQ(p.inv, (std::vector<int>{0, 4, 5, 1, 2, 3}));
  EXPECT_EQ(p.offsets, (std::vector<int>{0, 4, 6}));
  // A local expert no rank routes to has an empty group; nothing received gives an empty plan.
  const ExpertDispatchPlan one = plan_expert_dispatch(mine, std::vector<int>{0, 0, 2, 0}, 2);
  EXPECT_EQ(one.perm, (std::vector<int>{0, 1}));
  EXPECT_EQ(one.offsets, (std::vector<int>{0, 2, 2}));
  const ExpertDispatchPlan none = plan_expert_dispatch(mine, std::vector<int>(4, 0), 2);
  EXPECT_EQ(none.received, 0);
  EXPECT_TRUE(none.perm.empty());
  EXPECT_EQ(none.offsets, (std::vector<int>{0, 0, 0}));
  EXPECT_THROW(plan_expert_dispatch(mine, got, 3), Error);  // 3 ranks do not divide 4 experts
}

TEST(PipelineSchedule, OneFOneBWarmsUpByTheStagesBehind) {
  EXPECT_EQ(units(train::pipeline_order(4, 0, 1, 6)), "F0.0 F0.1 F0.2 F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 B0.3 B0.4 B0.5 ");
  EXPECT_EQ(units(train::pipeline_order(4, 3, 1, 6)), "F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 F0.3 B0.3 F0.4 B0.4 F0.5 B0.5 ");
  EXPECT_EQ(units(train::pipeline_order(4, 1, 1, 2)), "F0.0 F0.1 B0.0 B0.1 ");  // fewer micro-batches than stages
}

TEST(PipelineSchedule, InterleavedIsMegatronsOrder) {
  // P = 2, V = 2, M = 4, rank 0: warm-up (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 units, worked by hand from
  // Megatron's get_model_chunk_id / microbatch id rules.
  EXPECT_EQ(units(train::pipeline_order(2, 0, 2, 4)),
            "F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 B1.2 B1.3 B0.2 B0.3 ");
  EXPECT_THROW(train::pipeline_order(2, 0, 2, 3), Error);  // M not a multiple of P
}

TEST(PipelineSchedule, EveryUnitRunsOnceAndBackwardFollowsItsForward) {
  for (int P : {2, 3, 4})
    for (int V : {1, 2, 3})
      for (int M : {P, 2 * P, 3 * P})
        for (int r = 0; r < P; ++r) {
          std::map<std::pair<int, int>, int> state;  // 0 none, 1 forward done, 2 backward done
          for (const auto& u : train::pipeline_order(P, r, V, M)) {
            int& st = state[{u.chunk, u.micro_batch}];
            ASSERT_EQ(st, u.forward ? 0 : 1) << P << " " << V << " " << M << " " << r;
            st = u.forward ? 1 : 2;
          }
          ASSERT_EQ(state.size(), static_cast<std::size_t>(V * M));
          for (const auto& [unit, st] : state) EXPECT_EQ(st, 2);
        }
}

// The dry-run tests' models: tied, without QK-norm, the vocabulary padded to 128.
ckpt::ModelConfig plan_config(int layers, int hidden, int ffn, int heads, int groups, int kv_channels, int vocab,
                              int max_positions) {
  ckpt::ModelConfig c;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.ffn_hidden_size = ffn;
  c.num_attention_heads = heads;
  c.num_query_groups = groups;
  c.kv_channels = kv_channels;
  c.vocab_size = vocab;
  c.make_vocab_size_divisible_by = 128;
  c.max_position_embeddings = max_positions;
  c.tie_word_embeddings = true;
  c.qk_layernorm = false;
  return c;
}

// Expert parallelism: a rank holds E / EP experts of each MoE layer, their optimizer state over expert-DP, their
// gradients' DP traffic over expert-DP, and sends (EP - 1) / EP of its k routed rows four times a MoE layer.
TEST(DryRun, ExpertParallelPlanEqualsHandComputedValues) {
  ckpt::ModelConfig c = plan_config(2, 8, 16, 2, 2, 4, 128, 16);
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 4;
  PlanOptions o;
  o.data = 4;
  o.expert = 2;
  o.distributed_optimizer = true;
  o.micro_batch_size = 1;
  o.global_batch_size = 8;  // 2 micro-batches per rank
  o.seq_length = 4;
  const auto plan = plan_parallel(c, o);
  const auto& s = plan.stages.at(0);
  // Per layer: 2 experts x (fc1 8x8 + fc2 8x4) = 192 expert parameters; router 4x8, QKV 24x8, proj 8x8, 2 norms 8.
  EXPECT_EQ(s.expert_parameters, 2 * 192);
  EXPECT_EQ(s.parameters, 2 * 192 + 2 * (32 + 192 + 64 + 16) + 128 * 8 + 8);
  EXPECT_EQ(s.moe_layers, 2);
  const double dense = static_cast<double>(s.parameters - s.expert_parameters);
  EXPECT_DOUBLE_EQ(s.optimizer, dense * 8 / 4 + 2 * 192 * 8 / 2.0);  // fp32: 8 bytes of moments
  EXPECT_DOUBLE_EQ(s.data_parallel_bytes, dense * 8 * 3 / 4 + 2 * 192 * 8 * 1 / 2.0);  // reduce-scatter + all-gather
  // 4 passes x 4 tokens x k 2 x hidden 8 x 4 bytes x (EP - 1) / EP, 2 layers, 2 micro-batches.
  EXPECT_DOUBLE_EQ(s.expert_parallel_bytes, 4 * 4 * 2 * 8 * 4 * 0.5 * 2 * 2);
  // TP 2 x EP 2 (expert tensor parallelism = TP): each rank holds its 2 experts' halves, fc1 4x8 + fc2 8x2; the
  // tensor group's traffic gains the combine weights' gradient (k 2 fp32 per token, all-reduced: 2 (t-1)/t) per
  // MoE layer over the dense layout's.
  o.expert = 2;
  o.tensor = 2;
  o.data = 2;
  const auto tp = plan_parallel(c, o).stages.at(0);
  EXPECT_EQ(tp.expert_parameters, 2 * 2 * (32 + 16));
  c.num_experts = 0;
  PlanOptions dense_options = o;
  dense_options.expert = 1;
  const auto dense_tp = plan_parallel(c, dense_options).stages.at(0);
  // 4 micro-batches (8 / DP 2) x 2 MoE layers x 2 (t-1)/t x 4 bytes x 4 tokens x k 2.
  EXPECT_DOUBLE_EQ(tp.tensor_parallel_bytes - dense_tp.tensor_parallel_bytes, 4 * 2 * (2 * 0.5 * 4 * 4 * 2));
  c.num_experts = 4;
  o.tensor = 1;
  o.data = 4;
  o.expert = 3;
  EXPECT_THROW(plan_parallel(c, o), Error);
}

TEST(DryRun, SmallConfigEqualsHandComputedValues) {
  const ckpt::ModelConfig c = plan_config(4, 64, 128, 4, 2, 16, 256, 64);
  PlanOptions o;
  o.tensor = 2;
  o.pipeline = 2;
  o.data = 2;
  o.sequence_parallel = true;
  o.distributed_optimizer = true;
  o.bf16 = true;
  o.micro_batch_size = 2;
  o.global_batch_size = 16;
  o.seq_length = 32;
  const auto plan = plan_parallel(c, o);
  EXPECT_EQ(plan.micro_batches_per_rank, 4);
  ASSERT_EQ(plan.stages.size(), 2u);
  const auto& s0 = plan.stages[0];
  const auto& s1 = plan.stages[1];
  // Per layer: 2 norms 64 + QKV 64x64 + proj 64x32 + fc1 128x64 + fc2 64x64 = 18560; embedding 128x64.
  EXPECT_EQ(s0.parameters, 8192 + 2 * 18560);
  EXPECT_EQ(s1.parameters, 2 * 18560 + 64 + 8192);  // final norm, and the tied embedding's replica
  EXPECT_EQ(s0.first_rank, 0);
  EXPECT_EQ(s1.first_rank, 4);
  EXPECT_EQ(s1.ranks, 4);
  EXPECT_DOUBLE_EQ(s0.weights, 2.0 * 45312);
  EXPECT_DOUBLE_EQ(s0.gradients, 4.0 * 45312);
  // The distributed optimizer (the CPU backend's and the GPU's, as Megatron's): fp32 master weights and the
  // two moments, 12 bytes per parameter, split over DP 2; per step fp32 gradients reduce-scattered (4 bytes)
  // and bf16 weights all-gathered (2), each (DP-1)/DP of the parameters.
  EXPECT_DOUBLE_EQ(s0.optimizer, 12.0 * 45312 / 2);
  // 64 tokens x 840 bytes per layer; stage 0 keeps 2 micro-batches (1F1B), stage 1 one plus the
  // final norm and fp32 logits, 64 x (128 + 512).
  EXPECT_EQ(s0.micro_batches_in_flight, 2);
  EXPECT_EQ(s1.micro_batches_in_flight, 1);
  EXPECT_DOUBLE_EQ(s0.activations, 2 * 2 * 53760.0);
  EXPECT_DOUBLE_EQ(s1.activations, 2 * 53760.0 + 40960);
  EXPECT_DOUBLE_EQ(s0.data_parallel_bytes, 45312 * 6.0 / 2);
  EXPECT_DOUBLE_EQ(s0.tensor_parallel_bytes, 4 * (2 * 32768.0 + 8192));
  EXPECT_DOUBLE_EQ(s1.tensor_parallel_bytes, 4 * (2 * 32768.0 + 8192 + 768));
  EXPECT_DOUBLE_EQ(s0.pipeline_bytes, 16384.0);
  EXPECT_DOUBLE_EQ(s1.pipeline_bytes, 16384.0);

  o.recompute_full = true;
  EXPECT_DOUBLE_EQ(plan_parallel(c, o).stages[0].activations, 2 * 2 * 4096.0 + 53760);
  o.recompute_full = false;
  o.distributed_optimizer = false;
  o.bf16 = false;
  const auto fp32 = plan_parallel(c, o).stages[0];
  EXPECT_DOUBLE_EQ(fp32.optimizer, 8.0 * 45312);
  EXPECT_DOUBLE_EQ(fp32.data_parallel_bytes, 45312 * 4.0 * 2 / 2);
  o.global_batch_size = 6;
  EXPECT_THROW(plan_parallel(c, o), Error);
}

// The GPU plan against measured peaks: the 350M shape (scripts/device-common.sh) on one H100 (scripts/device-mem1.sh,
// also with --recompute-granularity full), and on 2 x H200 over NCCL (scripts/device-mp2.sh, each
// GPU's peak): DP2, DP2 with the distributed optimizer, TP2 + SP, PP2 (1F1B holds 2 micro-batches on stage 0).
// The NCCL rows were measured before the master weights became the bf16 weights plus a 16-bit remainder
// (master_split.h), which allocates 2 bytes less per parameter of the rank's optimizer range; those rows are
// compared less that exact difference (the one-GPU rows, measured after the change, moved by just that).
// Three constants were fitted to these (the runtime, kCudaRuntimeBytes; NCCL's buffers and the
// pipeline's, kCudaNccl*Bytes); every other term is the backend's buffer list, so a layout the list gets wrong
// misses by far more than the 1% (one GPU) or 3% (NCCL, one constant for every group) allowed. (The
// Megatron-style plan missed PP2's stage 0 by 17.6% and TP2 + SP by 11%.)
TEST(DryRun, GpuPlanFollowsTheMeasuredPeaks) {
  ckpt::ModelConfig c;
  c.num_layers = 24, c.hidden_size = 1024, c.ffn_hidden_size = 2816, c.num_attention_heads = 16;
  c.num_query_groups = 8, c.kv_channels = 64, c.vocab_size = 50304, c.qk_layernorm = true;
  c.max_position_embeddings = 2048, c.tie_word_embeddings = true;  // dlm-train's default, as measured
  struct Case {
    int tensor, pipeline, data;
    bool sp, distributed, recompute;
    std::vector<double> measured_gib;  // per stage
    bool fp32_master = false;          // measured with fp32 master weights (2 bytes more per optimizer parameter)
  };
  const std::vector<Case> cases = {{1, 1, 1, false, false, false, {20.85}},
                                   {1, 1, 1, false, false, true, {9.11}},
                                   {1, 1, 2, false, false, false, {22.81}, true},
                                   {1, 1, 2, false, true, false, {20.93}, true},
                                   {2, 1, 1, true, false, false, {13.70}, true},
                                   {1, 2, 1, false, false, false, {21.34, 14.74}, true}};
  for (const Case& k : cases) {
    PlanOptions o;
    o.tensor = k.tensor, o.pipeline = k.pipeline, o.data = k.data, o.sequence_parallel = k.sp;
    o.distributed_optimizer = k.distributed, o.micro_batch_size = 8, o.global_batch_size = 32, o.seq_length = 2048;
    o.bf16 = true, o.cuda_backend = true, o.recompute_full = k.recompute;
    const auto plan = plan_parallel(c, o);
    ASSERT_EQ(plan.stages.size(), k.measured_gib.size());
    for (std::size_t s = 0; s < plan.stages.size(); ++s) {
      const double gib = plan.stages[s].memory() / (1 << 30);
      const bool nccl = k.tensor * k.pipeline * k.data > 1;
      const double fp32_master_gib = k.fp32_master ? 2.0 * static_cast<double>(plan.stages[s].parameters) /
                                                         (k.distributed ? k.data : 1) / (1 << 30)
                                                   : 0.0;
      EXPECT_NEAR(gib / (k.measured_gib[s] - fp32_master_gib), 1.0, nccl ? 0.03 : 0.01)
          << "TP" << k.tensor << " PP" << k.pipeline << " DP" << k.data << (k.recompute ? " recomputing" : "")
          << " stage " << s << ": plan " << gib
          << " GiB, measured " << k.measured_gib[s];
    }
  }
}

// The GPU plan's activation terms are sums of cuda_activation_layout, the buffers CudaModel allocates (the GPU test
// CudaModel.AllocatesTheActivationLayout holds the model to the layout). For the 350M shape at micro-batch 8 x 2048
// they are the bytes the plan gave when it listed the buffers itself: one GPU, with full recomputation, and the two
// stages of PP2 under TP2 + SP.
TEST(DryRun, GpuActivationBytesAreTheLayoutsBuffers) {
  ckpt::ModelConfig c;
  c.num_layers = 24, c.hidden_size = 1024, c.ffn_hidden_size = 2816, c.num_attention_heads = 16;
  c.num_query_groups = 8, c.kv_channels = 64, c.vocab_size = 50304;
  struct Case {
    int tensor;
    bool sp, pre, post, recompute;
    double layer, shared, head, inputs;
  };
  const Case cases[] = {{1, false, true, true, false, 581566464, 2294521856, 67174400, 806968},
                        {1, false, true, true, true, 33554432, 2842533888, 67174400, 806968},
                        {2, true, true, false, false, 324337664, 1420533760, 0, 806968},
                        {2, true, false, true, false, 324337664, 1303093248, 50364416, 806968}};
  const std::int64_t tokens = 8 * 2048;
  for (const Case& k : cases) {
    const auto b = cuda_activation_bytes(c, tokens, k.tensor, k.sp, k.pre, k.post, k.recompute);
    const std::string what = fmt::format("TP{} SP{} pre {} post {} recompute {}", k.tensor, k.sp, k.pre, k.post,
                                         k.recompute);
    EXPECT_EQ(b.per_layer_slot, k.layer) << what;
    EXPECT_EQ(b.shared, k.shared) << what;
    EXPECT_EQ(b.per_extra_head_slot, k.head) << what;
    EXPECT_EQ(b.per_micro_batch_inputs, k.inputs) << what;
    const auto l = cuda_activation_layout(c, tokens, k.tensor, k.sp, k.pre, k.post);
    const double rest = static_cast<double>(l.layer.rest_bytes()), input = static_cast<double>(l.layer.input_bytes());
    EXPECT_EQ(b.per_layer_slot, k.recompute ? input : input + rest) << what;
    EXPECT_EQ(b.shared, static_cast<double>(l.shared.bytes()) + (k.recompute ? rest : 0.0)) << what;
    EXPECT_EQ(l.rows, k.sp ? tokens / k.tensor : tokens) << what;
    EXPECT_EQ(l.shared.head_x, 0) << what;  // 2 ffn >= hidden: the head's rows live in dgu
    EXPECT_EQ(l.shared.tmp_full != 0, k.sp) << what;
  }
}

}  // namespace
}  // namespace dlm::train
