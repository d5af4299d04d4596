#include "dlm/ckpt/checkpoint.h"
#include "dlm/ckpt/tools.h"

#include <cstring>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace dlm::ckpt;

namespace {

TrainingTensors random_state(const ModelConfig& c, std::uint32_t seed) {
  return {test::random_model(c, seed), test::random_model(c, seed + 1), test::random_model(c, seed + 2)};
}

bool same(const TensorSet& a, const TensorSet& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [n, t] : a)
    if (!b.count(n) || b.at(n).shape != t.shape || b.at(n).bytes != t.bytes) return false;
  return true;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dlm::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Sharding, RulesForQkvFc1VocabAndStages) {
  const ModelConfig c = test::small_config();  // 3 layers, 4 heads, 2 groups, ffn 48, vocab 384 padded
  const ParallelLayout l{.tp = 2, .pp = 2};
  EXPECT_EQ(l.stage_layers(c), (std::vector<int>{2, 1}));
  const auto shards = rank_shards(c, l, 1, 0);
  auto find = [&](const std::string& n) -> const TensorShard& {
    for (const auto& s : shards)
      if (s.name == n) return s;
    throw std::runtime_error("no " + n);
  };
  const TensorShard& qkv = find("decoder.layers.1.self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv.local_shape, (std::vector<std::int64_t>{32, 32}));  // one group: (2 q + k + v) * 8 rows
  EXPECT_EQ(qkv.pieces[0].global_start, 32);
  const TensorShard& fc1 = find("decoder.layers.0.mlp.linear_fc1.weight");
  ASSERT_EQ(fc1.pieces.size(), 2u);
  EXPECT_EQ(fc1.pieces[0].global_start, 24);  // gate half of rank 1
  EXPECT_EQ(fc1.pieces[1].global_start, 72);  // up half: 48 + 24
  EXPECT_EQ(fc1.pieces[1].local_start, 24);
  EXPECT_EQ(find("decoder.layers.0.mlp.linear_fc2.weight").pieces[0].dim, 1);
  EXPECT_EQ(find("embedding.word_embeddings.weight").pieces[0].global_start, 192);
  EXPECT_FALSE(find("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight").saved);  // tp rank 1's replica
  EXPECT_THROW(find("decoder.layers.2.mlp.linear_fc2.weight"), std::runtime_error);           // stage 1's layer
  EXPECT_NE(error_of([&] { rank_shards(c, {.tp = 4}, 0, 0); }).find("tp 4 does not divide num_query_groups 2"), std::string::npos);
  EXPECT_NE(error_of([&] { rank_shards(c, {.pp = 2, .layers_per_stage = {3, 1}}, 0, 0); }).find("do not sum"), std::string::npos);
}

TEST(Checkpoint, ReshardRoundTripsAreBitExact) {
  const auto dir = test::fresh_dir("ck");
  const ModelConfig c = test::small_config();
  const TrainingTensors state = random_state(c, 11);
  save_checkpoint((dir / "a").string(), c, {}, state, {.iteration = 5, .consumed_samples = 40, .rng_json = R"({"seed": 3})"});
  const TrainingTensors a = CheckpointReader((dir / "a").string()).read_global();
  ASSERT_TRUE(same(a.params, state.params) && same(a.exp_avg, state.exp_avg) && same(a.exp_avg_sq, state.exp_avg_sq));

  // TP1 -> TP2 PP2 (uneven: 2 + 1 layers), each rank loading its slab of the TP1 files.
  const ParallelLayout l22{.tp = 2, .pp = 2};
  CheckpointReader r1((dir / "a").string());
  CheckpointWriter w((dir / "b").string(), 6, c, l22);
  w.begin();
  for (int pp = 0; pp < 2; ++pp)
    for (int tp = 0; tp < 2; ++tp) {
      TrainingTensors local = r1.read_rank(l22, tp, pp);
      for (const TensorShard& s : rank_shards(c, l22, tp, pp))
        ASSERT_EQ(local.params.at(s.name).bytes, extract_shard(state.params.at(s.name), s).bytes) << s.name;
      w.write_rank(tp, pp, local);
    }
  w.commit(r1.metadata().state);
  CheckpointReader r2((dir / "b").string());
  EXPECT_EQ(r2.metadata().state.consumed_samples, 40);
  EXPECT_EQ(r2.metadata().state.iteration, 6);
  EXPECT_EQ(r2.metadata().layout.tp, 2);
  // TP2 PP2 -> TP4 PP1 is not possible with 2 KV groups; TP2 PP3 with one layer per stage instead.
  const ParallelLayout l23{.tp = 2, .pp = 3};
  for (int pp = 0; pp < 3; ++pp)
    for (int tp = 0; tp < 2; ++tp) {
      TrainingTensors local = r2.read_rank(l23, tp, pp);
      for (const TensorShard& s : rank_shards(c, l23, tp, pp))
        ASSERT_EQ(local.exp_avg_sq.at(s.name).bytes, extract_shard(state.exp_avg_sq.at(s.name), s).bytes) << s.name;
    }
  const TrainingTensors back = r2.read_global();
  EXPECT_TRUE(same(back.params, state.params) && same(back.exp_avg, state.exp_avg) && same(back.exp_avg_sq, state.exp_avg_sq));
  EXPECT_EQ(fs::path(resolve_checkpoint((dir / "b").string())).filename(), "iter_0000006");
}

// Expert tensors under TP x EP (sharding.h): split along the experts by EP and, within each expert, as the dense
// fc1 (column-parallel halves) and fc2 (row-parallel); their shards are the product of both. A TP2 x EP2 save reads
// back whole, and into TP1 x EP2, TP2 x EP1 and TP2 x EP4 ranks, element for element.
TEST(Checkpoint, ExpertTensorsReshardBetweenTensorAndExpertLayouts) {
  ModelConfig c = test::small_config();
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 16;
  c.moe_shared_expert_intermediate_size = 8;
  const ParallelLayout l22{.tp = 2, .ep = 2};
  const auto shards = rank_shards(c, l22, 1, 0, 1);
  auto find = [&](const std::string& n) -> const TensorShard& {
    for (const auto& s : shards)
      if (s.name == n) return s;
    throw std::runtime_error("no " + n);
  };
  const TensorShard& fc1 = find("decoder.layers.0.mlp.experts.linear_fc1.weight");  // [4, 32, 32]
  EXPECT_EQ(fc1.local_shape, (std::vector<std::int64_t>{2, 16, 32}));
  const auto boxes = shard_boxes(fc1.pieces, fc1.global_shape);
  ASSERT_EQ(boxes.size(), 2u);  // experts 2..3 x (gate rows 8..15, up rows 24..31)
  EXPECT_EQ(boxes[0].global.start, (std::vector<std::int64_t>{2, 8, 0}));
  EXPECT_EQ(boxes[1].global.start, (std::vector<std::int64_t>{2, 24, 0}));
  EXPECT_EQ(boxes[1].local.start, (std::vector<std::int64_t>{0, 8, 0}));
  const TensorShard& fc2 = find("decoder.layers.0.mlp.experts.linear_fc2.weight");  // [4, 32, 16]
  EXPECT_EQ(fc2.local_shape, (std::vector<std::int64_t>{2, 32, 8}));
  EXPECT_TRUE(fc2.saved);
  EXPECT_EQ(find("decoder.layers.0.mlp.shared_experts.linear_fc1.weight").local_shape, (std::vector<std::int64_t>{8, 32}));
  EXPECT_FALSE(find("decoder.layers.0.mlp.router.weight").saved);  // tp rank 1's replica
  EXPECT_EQ(error_of([&] { rank_shards(c, {.tp = 2}, 0, 0); }), "");  // MoE layers under TP: no longer refused
  ModelConfig odd = c;
  odd.moe_ffn_hidden_size = 15;
  EXPECT_NE(error_of([&] { rank_shards(odd, {.tp = 2}, 0, 0); }).find("tp 2 does not divide moe_ffn_hidden_size 15"),
            std::string::npos);

  const auto dir = test::fresh_dir("ck_experts");
  const TrainingTensors state = random_state(c, 21);
  save_checkpoint((dir / "a").string(), c, l22, state, {.iteration = 2});
  EXPECT_TRUE(validate_checkpoint((dir / "a").string()).errors.empty());
  CheckpointReader r((dir / "a").string());
  const TrainingTensors whole = r.read_global();
  EXPECT_TRUE(same(whole.params, state.params) && same(whole.exp_avg, state.exp_avg) && same(whole.exp_avg_sq, state.exp_avg_sq));
  for (const ParallelLayout& l : {ParallelLayout{.tp = 1, .ep = 2}, ParallelLayout{.tp = 2, .ep = 1}, ParallelLayout{.tp = 2, .ep = 4}})
    for (int tp = 0; tp < l.tp; ++tp)
      for (int ep = 0; ep < l.ep; ++ep) {
        const TrainingTensors local = r.read_rank(l, tp, 0, true, ep);
        for (const TensorShard& s : rank_shards(c, l, tp, 0, ep))
          ASSERT_EQ(local.exp_avg.at(s.name).bytes, extract_shard(state.exp_avg.at(s.name), s).bytes)
              << s.name << " tp " << l.tp << " ep " << l.ep;
      }
  // validate() checks the boxes: a shard record dropped leaves elements in no shard, one repeated saves them twice.
  const std::string meta = resolve_checkpoint((dir / "a").string()) + "/metadata.json";
  const std::string text = dlm::read_text_file(meta);
  auto damaged = [&](bool repeat) {
    nlohmann::json m = nlohmann::json::parse(text);
    for (auto& t : m["tensors"])
      if (t["name"] == "decoder.layers.0.mlp.experts.linear_fc2.weight") {
        if (repeat) t["shards"][1] = t["shards"][0];
        else t["shards"].erase(t["shards"].size() - 1);
      }
    dlm::write_file_atomically(meta, m.dump());
    const Report r = validate_checkpoint((dir / "a").string());
    return r.errors.empty() ? std::string() : r.errors.front();
  };
  EXPECT_EQ(damaged(false), "tensor 'decoder.layers.0.mlp.experts.linear_fc2.weight': 512 of its 2048 elements are in no shard");
  EXPECT_NE(damaged(true).find("elements from [0, 0, 0] are saved twice"), std::string::npos);
}

TEST(Checkpoint, TiedEmbeddingsAcrossStagesAndWeightsOnly) {
  const auto dir = test::fresh_dir("ck");
  const ModelConfig c = test::small_config(false, true);
  const TensorSet params = test::random_model(c, 5);
  const ParallelLayout l{.tp = 2, .pp = 3};
  save_checkpoint(dir.string(), c, l, {params, {}, {}}, {.iteration = 1});
  CheckpointReader r(dir.string());
  EXPECT_EQ(r.metadata().groups, std::vector<std::string>{"model"});
  const TrainingTensors last = r.read_rank(l, 1, 2);
  ASSERT_TRUE(last.params.count("embedding.word_embeddings.weight"));  // the last stage's replica is loaded
  EXPECT_FALSE(last.has_optimizer());
  EXPECT_TRUE(same(r.read_global().params, params));
}

// A writer killed after renaming iter_5 into place but before replacing `latest` leaves iter_5 complete and
// uncommitted: saving iteration 5 again replaces it; a committed iteration is never overwritten.
TEST(Checkpoint, UncommittedLeftoverIsReplacedCommittedIterationIsNot) {
  const auto dir = test::fresh_dir("ck");
  const ModelConfig c = test::small_config();
  const TensorSet a = test::random_model(c, 1), b = test::random_model(c, 2);
  save_checkpoint(dir.string(), c, {}, {a, {}, {}}, {.iteration = 3});
  save_checkpoint(dir.string(), c, {}, {a, {}, {}}, {.iteration = 5});
  std::ofstream(dir / "latest") << "iter_0000003\n";  // as if killed before `latest` moved on
  save_checkpoint(dir.string(), c, {}, {b, {}, {}}, {.iteration = 5});
  EXPECT_TRUE(same(CheckpointReader(dir.string()).read_global().params, b));
  EXPECT_EQ(CheckpointReader(dir.string()).metadata().state.iteration, 5);
  try {
    save_checkpoint(dir.string(), c, {}, {a, {}, {}}, {.iteration = 3});
    FAIL() << "iteration 3 was committed";
  } catch (const dlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("this iteration was saved before"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same(CheckpointReader((dir / "iter_0000003").string()).read_global().params, a));
}

TEST(Checkpoint, DamageIsReported) {
  const auto dir = test::fresh_dir("ck");
  const ModelConfig c = test::small_config();
  TrainingTensors state = random_state(c, 3);
  // A recognisable run of values to find in the file.
  auto norm = state.params.at("decoder.final_layernorm.weight").f32();
  for (std::size_t i = 0; i < norm.size(); ++i) norm[i] = 1000.f + static_cast<float>(i);
  const std::string final_dir = save_checkpoint(dir.string(), c, {.tp = 2}, state, {.iteration = 2});
  const fs::path shard = fs::path(final_dir) / "rank_tp00_pp00.h5";
  std::string bytes = dlm::read_text_file(shard.string());
  const auto at = bytes.find(std::string(reinterpret_cast<const char*>(norm.data()), 64));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 5] ^= 0x10;
  { std::ofstream(shard, std::ios::binary) << bytes; }
  EXPECT_NE(error_of([&] { CheckpointReader(dir.string()).read_global(); }).find("checksum mismatch"), std::string::npos);

  fs::remove(fs::path(final_dir) / "rank_tp01_pp00.h5");
  EXPECT_NE(error_of([&] { CheckpointReader r(dir.string()); }).find("shard file 'rank_tp01_pp00.h5' is missing"), std::string::npos);
  EXPECT_NE(error_of([&] { CheckpointReader r(final_dir + ".tmp"); }).find("unfinished"), std::string::npos);
  EXPECT_NE(error_of([&] { save_checkpoint(dir.string(), c, {}, state, {.iteration = 2}); }).find("already exists"), std::string::npos);
  state.params.erase("output_layer.weight");
  EXPECT_NE(error_of([&] { save_checkpoint(dir.string(), c, {}, state, {.iteration = 3}); }).find("'output_layer.weight' is missing"), std::string::npos);
  EXPECT_EQ(dlm::read_text_file((dir / "latest").string()), "iter_0000002\n");
}

TEST(Checkpoint, MetadataChecks) {
  const auto dir = test::fresh_dir("ck");
  const ModelConfig c = test::small_config();
  const std::string final_dir = save_checkpoint(dir.string(), c, {.tp = 2}, {test::random_model(c, 1), {}, {}}, {.iteration = 0});
  const std::string text = dlm::read_text_file(final_dir + "/metadata.json");
  const CheckpointMetadata m = metadata_from_json(text, "metadata.json");
  EXPECT_EQ(metadata_to_json(m), text);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    return error_of([&] { metadata_from_json(t, "metadata.json"); });
  };
  EXPECT_NE(with("\"global_start\": 192", "\"global_start\": 193").find("lies outside"), std::string::npos);
  EXPECT_NE(with("\"version\": 1", "\"version\": 9").find("'version': 9"), std::string::npos);
  EXPECT_NE(with("\"tp\": 2", "\"tp\": \"2\"").find("metadata.json: field 'tp'"), std::string::npos);
  EXPECT_NE(with("rank_tp01_pp00.h5", "../x.h5").find("must be a rank .h5 file"), std::string::npos);
  EXPECT_NE(with("\"format\": \"dlm-checkpoint\"", "\"format\": 3").find("format"), std::string::npos);
  // a negative count and a tensor listed twice (--load then failed late with "sample
  // 18446744073709551584 is past the split").
  EXPECT_EQ(with("\"iteration\": 0", "\"iteration\": -1"), "metadata.json: training: 'iteration' is -1, expected a count >= 0");
  EXPECT_EQ(with("\"consumed_samples\": 0", "\"consumed_samples\": -32"),
            "metadata.json: training: 'consumed_samples' is -32, expected a count >= 0");
  nlohmann::json twice = nlohmann::json::parse(text);
  twice["tensors"].push_back(twice["tensors"][0]);
  EXPECT_NE(error_of([&] { metadata_from_json(twice.dump(), "metadata.json"); }).find("is listed twice"), std::string::npos);
}

// a `latest` longer than any folder name is one line, not the filesystem's exception.
TEST(Checkpoint, HugeLatestIsOneLine) {
  const auto dir = test::fresh_dir("ck");
  dlm::write_file_atomically((dir / "latest").string(), std::string(5000, 'x'));
  EXPECT_EQ(error_of([&] { CheckpointReader r(dir.string()); }),
            (dir / "latest").string() + ": holds 5000 bytes, expected a folder name such as iter_0000100");
}

}  // namespace
