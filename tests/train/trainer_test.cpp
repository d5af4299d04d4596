#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "dlm/train/checkpoint_saver.h"
#include "dlm/train/model.h"
#include "dlm/train/train_checkpoint.h"
#include "dlm/train/trainer.h"
#include "dlm/train/training_model.h"

namespace dlm::train {
namespace {

constexpr std::int64_t kVocab = 12;
constexpr std::int32_t kMask = 11;

// A model small enough to reason about, carrying the tensors of a real (tiny) model config so that it
// checkpoints like one: logits of position i = embedding[input_i] + final_layernorm (used as a bias; a
// norm, so no weight decay). The layer tensors are carried along untouched by the loss.
ckpt::ModelConfig table_config() {
  ckpt::ModelConfig c;
  c.num_layers = 1;
  c.hidden_size = kVocab;
  c.ffn_hidden_size = 8;
  c.num_attention_heads = 2;
  c.num_query_groups = 2;
  c.kv_channels = 6;
  c.vocab_size = kVocab;
  c.make_vocab_size_divisible_by = 1;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 64;
  return c;
}

class TableModel final : public TrainableModel {
 public:
  TableModel() : specs_(ckpt::model_tensors(table_config())) {
    for (std::size_t k = 0; k < specs_.size(); ++k) {
      const auto n = static_cast<std::size_t>(ckpt::element_count(specs_[k].shape));
      values_.emplace_back(n, 0.0f);
      grads_.emplace_back(n, 0.0f);
      if (specs_[k].name == "decoder.final_layernorm.weight") bias_index_ = k;
    }
    auto& t = table();
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.01f * static_cast<float>((i * 7919) % 13) - 0.06f;
  }
  std::vector<float>& table() { return values_[0]; }  // embedding.word_embeddings.weight
  std::vector<float>& bias() { return values_[bias_index_]; }
  std::vector<ParamRef> parameters() override {
    std::vector<ParamRef> out;
    for (std::size_t k = 0; k < specs_.size(); ++k)
      out.push_back({specs_[k].name, values_[k], grads_[k], !specs_[k].is_norm, specs_[k].shape});
    return out;
  }
  void zero_grad() override {
    for (auto& g : grads_) std::fill(g.begin(), g.end(), 0.0f);
  }
  double forward_backward(const ModelBatch& b) override {
    auto logits = forward(b);
    std::vector<float> d(logits.size());
    double loss = weighted_cross_entropy(logits, kVocab, b, d);
    for (std::size_t i = 0; i < b.input_ids.size(); ++i)
      for (std::int64_t v = 0; v < kVocab; ++v) {
        const float g = d[i * kVocab + static_cast<std::size_t>(v)];
        grads_[0][static_cast<std::size_t>(b.input_ids[i] * kVocab + v)] += g;
        grads_[bias_index_][static_cast<std::size_t>(v)] += g;
      }
    return loss;
  }
  double forward_loss(const ModelBatch& b) override { return weighted_cross_entropy(forward(b), kVocab, b); }

 private:
  std::vector<float> forward(const ModelBatch& b) {
    std::vector<float> logits(b.input_ids.size() * kVocab);
    for (std::size_t i = 0; i < b.input_ids.size(); ++i)
      for (std::int64_t v = 0; v < kVocab; ++v)
        logits[i * kVocab + static_cast<std::size_t>(v)] =
            values_[0][static_cast<std::size_t>(b.input_ids[i] * kVocab + v)] + values_[bias_index_][static_cast<std::size_t>(v)];
    return logits;
  }
  std::vector<ckpt::TensorSpec> specs_;
  std::vector<std::vector<float>> values_, grads_;
  std::size_t bias_index_ = 0;
};

// Token j of sample s: a skewed, deterministic stream (ids 0..9), eod = 10 every 9 tokens.
class SyntheticSource final : public SampleSource {
 public:
  explicit SyntheticSource(std::uint64_t n) : n_(n) {}
  std::uint64_t size() const override { return n_; }
  void read(std::uint64_t index, std::span<std::int32_t> tokens) const override {
    for (std::size_t j = 0; j < tokens.size(); ++j) {
      const std::uint64_t k = index * 31 + j;
      tokens[j] = k % 9 == 8 ? 10 : static_cast<std::int32_t>((k * k) % 7 < 4 ? k % 3 : k % 10);
    }
  }

 private:
  std::uint64_t n_;
};

// SyntheticSource's first n samples, each read recorded (in any order: the reads may come from several threads).
class Recording final : public SampleSource {
 public:
  explicit Recording(std::uint64_t n) : n_(n) {}
  std::uint64_t size() const override { return n_; }
  void read(std::uint64_t index, std::span<std::int32_t> tokens) const override {
    std::lock_guard lock(mutex_);
    reads.push_back(index);
    SyntheticSource(n_).read(index, tokens);
  }
  mutable std::vector<std::uint64_t> reads;

 private:
  std::uint64_t n_;
  mutable std::mutex mutex_;
};

TrainerOptions options(std::int64_t iters) {
  TrainerOptions o;
  o.train_iters = iters;
  o.micro_batch_size = 2;
  o.global_batch_size = 4;
  o.seq_length = 16;
  o.lr.max_lr = 0.05;
  o.lr.min_lr = 0.005;
  o.lr.warmup_iters = 2;
  o.lr.decay_iters = iters;
  o.lr.style = LrDecayStyle::kCosine;
  o.lr.global_batch_size = 4;
  o.adam.weight_decay = 0.1;
  o.objective.mask_token = kMask;
  o.objective.varilen_prob = 0;
  o.eod_token = 10;
  o.eod_mask_loss = true;
  o.log_interval = 5;
  return o;
}

TEST(Trainer, LossFallsBelowTheUnigramBaseline) {
  TableModel model;
  SyntheticSource train(1000), valid(100);
  auto o = options(60);
  o.eval_interval = 30;
  o.eval_iters = 2;
  Trainer trainer(o, model, train, &valid);
  const double before = trainer.evaluate();
  auto stats = trainer.run(nullptr);
  ASSERT_EQ(stats.size(), 60u);
  // Each evaluation reads the batches after the last one's (Megatron's validation iterator): before, at 30, at 60
  // and at the end of training, 2 batches each.
  EXPECT_EQ(trainer.validation_batches_read(), 8);
  const double after = Trainer(o, model, train, &valid).evaluate();  // the batches `before` read, trained model
  const double baseline = unigram_entropy(train, 16, 200);
  EXPECT_GT(before, baseline);
  EXPECT_LT(after, baseline);  // the table learns each token's successor statistics
  EXPECT_EQ(trainer.progress().consumed_samples, 240);
  EXPECT_EQ(stats[0].lr, 0.0);  // Megatron: the first warmed-up update runs at lr(0) = init
  EXPECT_DOUBLE_EQ(stats[2].lr, 0.05);
}

TEST(Trainer, ResumeContinuesTheSameRunBitForBit) {
  SyntheticSource train(1000);
  TableModel straight;
  auto straight_stats = Trainer(options(20), straight, train, nullptr).run(nullptr);

  // 10 iterations, "killed" by --exit-interval with a save, then a fresh process resumes.
  struct Saved {
    TrainProgress progress;
    std::vector<std::vector<float>> values;
    AdamW adam{{}};
  } saved;
  TableModel first;
  auto o = options(20);
  o.exit_interval = 10;
  auto first_stats = Trainer(o, first, train, nullptr).run([&](const TrainProgress& p, TrainableModel&, const AdamW& a) {
    saved.progress = p;
    for (auto& p : first.parameters()) saved.values.emplace_back(p.value.begin(), p.value.end());
    saved.adam = a;
  });
  ASSERT_EQ(first_stats.size(), 10u);
  ASSERT_EQ(saved.progress.iteration, 10);

  TableModel second;
  auto params = second.parameters();
  for (std::size_t k = 0; k < params.size(); ++k) std::copy(saved.values[k].begin(), saved.values[k].end(), params[k].value.begin());
  Trainer resumed(options(20), second, train, nullptr);
  resumed.resume(saved.progress, saved.adam);
  auto second_stats = resumed.run(nullptr);
  ASSERT_EQ(second_stats.size(), 10u);
  for (std::size_t k = 0; k < 20; ++k) {
    const auto& s = k < 10 ? first_stats[k] : second_stats[k - 10];
    EXPECT_EQ(s.iteration, straight_stats[k].iteration);
    EXPECT_EQ(s.loss, straight_stats[k].loss) << "iteration " << k + 1;  // bit for bit
    EXPECT_EQ(s.lr, straight_stats[k].lr);
    EXPECT_EQ(s.grad_norm, straight_stats[k].grad_norm);
  }
  EXPECT_EQ(second.table(), straight.table());
}

TEST(Trainer, SignalStopsAfterTheIterationWithACheckpoint) {
  SyntheticSource train(1000);
  TableModel m;
  std::atomic<bool> stop{true};  // as if SIGTERM arrived during the first iteration
  int saves = 0;
  std::int64_t saved_iteration = -1;
  auto stats = Trainer(options(20), m, train, nullptr).run(
      [&](const TrainProgress& p, TrainableModel&, const AdamW&) { ++saves, saved_iteration = p.iteration; }, &stop);
  EXPECT_EQ(stats.size(), 1u);
  EXPECT_EQ(saves, 1);
  EXPECT_EQ(saved_iteration, 1);
}

TEST(Trainer, WritesJsonlAndTensorBoard) {
  SyntheticSource train(1000), valid(100);
  TableModel m;
  auto o = options(10);
  const std::string dir = ::testing::TempDir() + "/dlm_trainer_metrics";
  std::filesystem::remove_all(dir);
  o.metrics_path = dir + ".jsonl";
  std::filesystem::remove(o.metrics_path);
  o.tensorboard_dir = dir;
  o.eval_interval = 10;
  auto stats = Trainer(o, m, train, &valid).run(nullptr);
  std::ifstream in(o.metrics_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u);  // iterations 5 and 10, the validation at 10, the one at the end of training
  EXPECT_EQ(lines[0].rfind("{\"iteration\": 5, \"consumed_samples\": 20, \"grad_norm\": ", 0), 0u) << lines[0];
  EXPECT_NE(lines[2].find("\"valid_loss\""), std::string::npos);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_EQ(files, 1);
}

// Every TensorBoard tag Megatron writes for the monitoring flags, by name in the event file (the interop test reads
// the values with tensorboard's own reader); --tensorboard-log-interval 2 writes the per-iteration tags at even
// iterations only (the "vs samples" twins at 4 samples an iteration).
TEST(Trainer, WritesMegatronsTensorBoardTags) {
  SyntheticSource train(1000), valid(100);
  TableModel m;
  auto o = options(10);
  const std::string dir = ::testing::TempDir() + "/dlm_trainer_megatron_tags";
  std::filesystem::remove_all(dir);
  o.tensorboard_dir = dir;
  o.eval_interval = 5;
  o.monitor.log_throughput = o.monitor.log_params_norm = o.monitor.log_num_zeros_in_grad = true;
  o.monitor.log_timers_to_tensorboard = o.monitor.log_memory_to_tensorboard = true;
  o.monitor.log_validation_ppl_to_tensorboard = true;
  o.monitor.tensorboard_log_interval = 2;
  o.monitor.flops_per_iteration = 1e9;
  Trainer(o, m, train, &valid).run(nullptr);
  std::string events;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    events.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (const char* tag : {"learning-rate", "batch-size", "lm loss", "loss-scale", "grad-norm", "num-zeros", "params-norm"}) {
    // A Value's tag is field 1, length-delimited: 0x0a, its length, the bytes.
    const std::string plain = std::string("\x0a") + static_cast<char>(std::strlen(tag)) + tag;
    const std::string samples = std::string(tag) + " vs samples";
    EXPECT_NE(events.find(plain), std::string::npos) << tag;
    EXPECT_NE(events.find(std::string("\x0a") + static_cast<char>(samples.size()) + samples), std::string::npos) << samples;
  }
  for (const char* tag : {"mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes", "iteration-time",
                          "throughput", "lm loss validation", "lm loss validation vs samples", "lm loss validation ppl",
                          "lm loss validation ppl vs samples"})
    EXPECT_NE(events.find(std::string("\x0a") + static_cast<char>(std::strlen(tag)) + tag), std::string::npos) << tag;
  // The per-iteration tags every other iteration: five "grad-norm" values in ten iterations.
  std::size_t grad_norms = 0;
  for (std::size_t at = 0; (at = events.find("\x0a\x09grad-norm\x15", at)) != std::string::npos; ++at) ++grad_norms;
  EXPECT_EQ(grad_norms, 5u);
  EXPECT_EQ(events.find("train/loss"), std::string::npos);  // dlm's own tags gave way to Megatron's
}

// Saves after every --save-interval-th iteration, on the agreed stop and after the last one; before failing on a
// non-finite step, only when its iteration was not saved already.
TEST(SaveSchedule, SavesAtIntervalsOnStopsAndAtTheEnd) {
  SaveSchedule schedule(3, 10);
  std::vector<std::int64_t> due;
  for (std::int64_t i = 1; i <= 10; ++i)
    if (schedule.due(i, i == 5)) due.push_back(i);
  EXPECT_EQ(due, (std::vector<std::int64_t>{3, 5, 6, 9, 10}));
  EXPECT_FALSE(SaveSchedule(0, 10).due(3, false));
  const SaveSchedule steps(0, 10, {2, 7});  // --checkpoint-steps 2,7
  EXPECT_TRUE(steps.due(2, false));
  EXPECT_TRUE(steps.due(7, false));
  EXPECT_FALSE(steps.due(3, false));
  EXPECT_TRUE(steps.due(10, false));
  EXPECT_TRUE(schedule.due_before_failing(6));
  schedule.saved(6);
  EXPECT_FALSE(schedule.due_before_failing(6));
  EXPECT_TRUE(schedule.due_before_failing(7));
}

TEST(TrainCheckpoint, ResumeFromDiskIsBitForBit) {
  SyntheticSource train(1000);
  const std::string dir = ::testing::TempDir() + "/dlm_train_ckpt";
  std::filesystem::remove_all(dir);
  const ckpt::ModelConfig config = table_config();
  TableModel straight;
  auto straight_stats = Trainer(options(16), straight, train, nullptr).run(nullptr);

  auto o = options(16);
  o.exit_interval = 6;
  o.save_interval = 3;
  TableModel first;
  // The save policy dlm-train uses (checkpoint_saver.h), on one process.
  CheckpointTarget target;
  target.dir = dir;
  target.config = config;
  target.metadata = {{"seed", "1234"}};
  SaveFn save = CheckpointSaver(target);
  auto first_stats = Trainer(o, first, train, nullptr).run(save);
  ASSERT_EQ(first_stats.size(), 6u);
  EXPECT_EQ(read_text_file(dir + "/latest"), "iter_0000006\n");
  EXPECT_TRUE(std::filesystem::exists(dir + "/iter_0000003/metadata.json"));

  TableModel second;
  auto params = second.parameters();
  auto loaded = load_train_checkpoint(dir, params, options(16).adam);
  check_config_matches(config, loaded.config, loaded.dir);
  restore_weights(loaded, params);
  EXPECT_EQ(loaded.progress.iteration, 6);
  EXPECT_EQ(loaded.progress.consumed_samples, 24);
  EXPECT_EQ(loaded.metadata.at("seed"), "1234");
  Trainer resumed(options(16), second, train, nullptr);
  resumed.resume(loaded.progress, loaded.optimizer);
  auto rest = resumed.run(save);
  ASSERT_EQ(rest.size(), 10u);
  for (std::size_t k = 0; k < 16; ++k) {
    const auto& s = k < 6 ? first_stats[k] : rest[k - 6];
    EXPECT_EQ(s.loss, straight_stats[k].loss) << "iteration " << k + 1;
  }
  EXPECT_EQ(second.table(), straight.table());
  EXPECT_EQ(read_text_file(dir + "/latest"), "iter_0000016\n");
}

// --async-save: a save point returns to training before the shards are written. The hook holds the write until the
// save point has returned, so a saver that wrote on the training thread (or waited for the write) would reach it
// first, and a saver that never wrote would leave no checkpoint.
TEST(TrainCheckpoint, AsyncSavePointReturnsBeforeTheWrite) {
  const std::string dir = ::testing::TempDir() + "/dlm_train_async_point";
  std::filesystem::remove_all(dir);
  TableModel model;
  AdamW optimizer(options(16).adam);
  std::promise<void> returned;
  std::shared_future<void> returned_future = returned.get_future().share();
  std::atomic<bool> write_after_return{false};
  std::thread::id writer_thread;
  CheckpointTarget target;
  target.dir = dir;
  target.config = table_config();
  target.async = true;
  target.before_write = [&] {
    writer_thread = std::this_thread::get_id();
    write_after_return = returned_future.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  };
  CheckpointSaver saver(target);
  TrainProgress progress;
  progress.iteration = 3;
  const std::vector<float> saved = model.table();
  saver(progress, model, optimizer);
  model.table()[0] += 1.0f;  // training goes on: the checkpoint keeps the save point's values
  returned.set_value();
  saver.wait();
  EXPECT_TRUE(write_after_return);
  EXPECT_NE(writer_thread, std::this_thread::get_id());
  EXPECT_EQ(read_text_file(dir + "/latest"), "iter_0000003\n");
  TableModel loaded;
  auto params = loaded.parameters();
  restore_weights(load_train_checkpoint(dir, params, options(16).adam), params);
  EXPECT_EQ(loaded.table(), saved);
}

TEST(TrainCheckpoint, ConfigDisagreeingWithTheFlagsIsAnError) {
  ckpt::ModelConfig flags, saved;
  saved.hidden_size = 128;
  try {
    check_config_matches(flags, saved, "ck/iter_0000010/metadata.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "ck/iter_0000010/metadata.json: the checkpoint has --hidden-size 128, the flags say 64");
  }
  EXPECT_THROW(load_train_checkpoint(::testing::TempDir() + "/no_such_checkpoint", {}, {}), Error);
}

TEST(Trainer, GradientAccumulationMatchesOneBigMicroBatch) {
  // Without clipping, 2 micro-batches of 2 give the gradient of one micro-batch of 4 (same samples,
  // same noise: it is keyed by the sample), up to float rounding.
  SyntheticSource train(1000);
  auto a = options(3), b = options(3);
  b.micro_batch_size = 4;
  a.clip_grad = b.clip_grad = 0;
  a.objective.kind = b.objective.kind = ObjectiveKind::kAutoregressive;
  TableModel ma, mb;
  auto sa = Trainer(a, ma, train, nullptr).run(nullptr);
  auto sb = Trainer(b, mb, train, nullptr).run(nullptr);
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(sa[k].loss, sb[k].loss, 1e-6);
}

// Megatron's evaluation: the validation iterator continues from one evaluation to the next (and across a resume,
// from (iteration / eval_interval) * eval_iters batches), and the test split is read once from its start at the end.
TEST(Trainer, ValidationContinuesAndTheTestSplitIsReadAtTheEnd) {
  SyntheticSource train(1000);
  Recording valid(100), test(100);
  TableModel m;
  auto o = options(10);
  o.eval_interval = 5;
  o.eval_iters = 2;
  Trainer trainer(o, m, train, &valid);
  trainer.set_test_data(&test);
  trainer.run(nullptr);
  std::vector<std::uint64_t> want(24);  // evaluations at 5, 10 and the end: 3 x 2 global batches of 4
  std::iota(want.begin(), want.end(), 0u);
  std::sort(valid.reads.begin(), valid.reads.end());
  EXPECT_EQ(valid.reads, want);
  want.resize(8);  // one evaluation of the test split, from its first sample
  std::sort(test.reads.begin(), test.reads.end());
  EXPECT_EQ(test.reads, want);

  Trainer resumed(o, m, train, &valid);
  resumed.resume(TrainProgress{7, 28});
  EXPECT_EQ(resumed.validation_batches_read(), 2);  // the evaluation at 5 was done
  valid.reads.clear();
  resumed.evaluate();
  std::sort(valid.reads.begin(), valid.reads.end());
  want.resize(8);
  std::iota(want.begin(), want.end(), 8u);
  EXPECT_EQ(valid.reads, want);
}

// Megatron's --full-validation: each evaluation reads every sample of the validation split once, from its first, with
// --eval-iters 0 too (13 samples: the last micro-batch of 2 rows is short), and its loss is the mean over the samples
// of each one's loss alone, whatever the micro-batch size (the noise is keyed by the sample).
TEST(Trainer, FullValidationEvaluatesEverySampleOnce) {
  SyntheticSource train(1000);
  Recording valid(13);
  const auto reads_of_each = [&] {
    std::map<std::uint64_t, int> n;
    for (std::uint64_t i : valid.reads) ++n[i];
    return n;
  };
  TableModel m;
  auto o = options(10);
  o.eval_interval = 5;
  o.eval_iters = 0;
  o.full_validation = true;
  o.eod_mask_loss = false;  // every sample weighs the same in its micro-batch's loss
  o.objective.kind = ObjectiveKind::kAutoregressive;
  Trainer trainer(o, m, train, &valid);
  trainer.run(nullptr);  // evaluations at 5, 10 and the end
  auto reads = reads_of_each();
  ASSERT_EQ(reads.size(), 13u);
  EXPECT_EQ(reads.rbegin()->first, 12u);
  for (const auto& [index, count] : reads) EXPECT_EQ(count, 3) << "sample " << index;

  valid.reads.clear();
  const double got = trainer.evaluate();
  reads = reads_of_each();
  ASSERT_EQ(reads.size(), 13u);
  for (const auto& [index, count] : reads) EXPECT_EQ(count, 1) << "sample " << index;
  double want = 0;
  std::vector<std::int32_t> sample(static_cast<std::size_t>(o.seq_length + 1));
  for (std::uint64_t i = 0; i < 13; ++i) {
    SyntheticSource(13).read(i, sample);
    SampleBatch one;
    one.batch = 1, one.seq = o.seq_length;
    one.tokens.assign(sample.begin(), sample.end() - 1);
    one.labels.assign(sample.begin() + 1, sample.end());
    one.loss_mask.assign(one.tokens.size(), 1.0f);
    one.sample_index = {i};
    want += m.forward_loss(make_model_batch(o.objective, one, {0, 1, 0, false})) / 13;
  }
  EXPECT_NEAR(got, want, 1e-6);

  // The diffusion objective: micro-batches of 1 and of 2 rows give the same mean.
  o.objective.kind = ObjectiveKind::kDiffusion;
  const double two_rows = Trainer(o, m, train, &valid).evaluate();
  o.micro_batch_size = 1;
  EXPECT_NEAR(Trainer(o, m, train, &valid).evaluate(), two_rows, 1e-6);
}

TEST(Trainer, RejectsBadOptionsBeforeAnyCompute) {
  SyntheticSource train(1000), small(10);
  TableModel m;
  auto o = options(10);
  o.global_batch_size = 5;
  EXPECT_THROW(Trainer(o, m, train, nullptr), Error);
  o = options(10);
  EXPECT_THROW(Trainer(o, m, small, nullptr), Error);  // 40 samples needed
  o.eval_interval = 5;
  EXPECT_NO_THROW(Trainer(o, m, train, nullptr));  // no validation data: no evaluation (Megatron's do_valid)
  SyntheticSource three(3);
  EXPECT_THROW(Trainer(o, m, train, &three), Error);  // fewer samples than one evaluation's global batch
  o = options(10);
  o.objective.mask_token = -1;
  EXPECT_THROW(Trainer(o, m, train, nullptr), Error);
  o = options(10);
  o.lr.warmup_iters = 10;
  EXPECT_THROW(Trainer(o, m, train, nullptr), Error);
}

TEST(UnigramEntropy, OfAUniformStream) {
  class Uniform final : public SampleSource {
   public:
    std::uint64_t size() const override { return 4; }
    void read(std::uint64_t, std::span<std::int32_t> t) const override {
      for (std::size_t j = 0; j < t.size(); ++j) t[j] = static_cast<std::int32_t>(j % 4);
    }
  } u;
  EXPECT_NEAR(unigram_entropy(u, 8, 4), std::log(4.0), 1e-12);
}

}  // namespace
}  // namespace dlm::train

namespace dlm::train {
namespace {

// TableModel whose forward_backward returns NaN on chosen calls (one call per micro-batch).
class NanOnCalls final : public TrainableModel {
 public:
  explicit NanOnCalls(std::set<int> calls) : calls_(std::move(calls)) {}
  std::vector<ParamRef> parameters() override { return model_.parameters(); }
  void zero_grad() override { model_.zero_grad(); }
  double forward_backward(const ModelBatch& b) override {
    const double loss = model_.forward_backward(b);
    return calls_.count(call_++) ? std::nan("") : loss;
  }
  double forward_loss(const ModelBatch& b) override { return model_.forward_loss(b); }
  TableModel model_;

 private:
  std::set<int> calls_;
  int call_ = 0;
};

TEST(Trainer, NonFiniteStepIsSkippedWithoutAnUpdate) {
  SyntheticSource train(1000);
  auto o = options(6);
  o.on_non_finite = NonFinitePolicy::kSkip;
  NanOnCalls m({4});  // iteration 3's first micro-batch (2 micro-batches per iteration)
  std::vector<std::vector<float>> table_after;
  Trainer t(o, m, train, nullptr);
  const auto stats = t.run(nullptr);
  ASSERT_EQ(stats.size(), 6u);
  for (std::size_t i = 0; i < stats.size(); ++i) EXPECT_EQ(stats[i].skipped, i == 2) << i;
  // The skipped step left the weights alone: a run of iterations 1, 2, 4, 5, 6 ends where this one does
  // only if iteration 3 changed nothing, so compare with a run that stops after 2 and one after 3.
  NanOnCalls two({}), three({4});
  auto o2 = o, o3 = o;
  o2.train_iters = 2, o3.train_iters = 3;
  Trainer(o2, two, train, nullptr).run(nullptr);
  Trainer(o3, three, train, nullptr).run(nullptr);
  EXPECT_EQ(two.model_.table(), three.model_.table());
  for (float v : m.model_.table()) ASSERT_TRUE(std::isfinite(v));
}

TEST(Trainer, NonFiniteStepStopsWithACheckpointOfTheLastGoodState) {
  SyntheticSource train(1000);
  NanOnCalls m({4}), reference({});
  auto o = options(6);
  auto o2 = o;
  o2.train_iters = 2;
  Trainer(o2, reference, train, nullptr).run(nullptr);
  std::int64_t saved_iteration = -1;
  std::vector<float> saved_table;
  try {
    Trainer(o, m, train, nullptr).run([&](const TrainProgress& p, TrainableModel& model, const AdamW&) {
      saved_iteration = p.iteration;
      saved_table.assign(model.parameters()[0].value.begin(), model.parameters()[0].value.end());
    });
    FAIL() << "a NaN loss must stop the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iteration 3: loss nan"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("with a checkpoint of iteration 2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(saved_iteration, 2);
  EXPECT_EQ(saved_table, reference.model_.table());
  EXPECT_EQ(parse_non_finite_policy("skip"), NonFinitePolicy::kSkip);
  EXPECT_THROW(parse_non_finite_policy("ignore"), Error);
}

// The CPU model of one process is Model::init(seed)'s, every parameter, in the model's tensor order.
TEST(TrainingModel, CpuModelOfOneProcessStartsFromModelInit) {
  const auto config = table_config();
  TrainingModelOptions o;
  o.seed = 11;
  o.threads = 1;
  TrainingModel made = make_training_model(config, o);
  ASSERT_TRUE(made.model);
  EXPECT_FALSE(made.placement);
  EXPECT_EQ(made.model->device_training(), nullptr);
  auto backend = make_cpu_backend(1);
  Model reference(config, *backend);
  reference.init(11);
  const auto params = made.model->parameters();
  ASSERT_EQ(params.size(), reference.parameters().size());
  for (const auto& p : params) {
    const auto expected = reference.export_parameter(p.name);
    ASSERT_EQ(std::vector<float>(p.value.begin(), p.value.end()), expected) << p.name;
  }
}

TEST(TrainingModel, CudaWithoutTheBackendIsOneLine) {
  if (cuda_built()) GTEST_SKIP() << "this build has the CUDA backend";
  TrainingModelOptions o;
  o.device = Device::kCuda;
  try {
    make_training_model(table_config(), o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--device cuda: this build of dlm has no CUDA backend (built without nvcc)");
  }
}

}  // namespace
}  // namespace dlm::train
