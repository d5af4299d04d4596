// The pickle and torch.save writers (torch_writer.h) read back through dlm's own readers, and
// dlm-ckpt's Megatron torch_dist export (megatron_export.h) read back by load_megatron_torch_dist.
// That megatron-core and torch open the same files is interop_ckpt_megatron_export's part.
#include <cstring>
#include <filesystem>
#include <limits>

#include <gtest/gtest.h>

#include "dlm/ckpt/megatron.h"
#include "dlm/ckpt/megatron_export.h"
#include "dlm/ckpt/pickle.h"
#include "dlm/ckpt/torch_file.h"
#include "dlm/ckpt/tools.h"
#include "dlm/ckpt/torch_writer.h"
#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "test_util.h"

namespace dlm::ckpt {
namespace {

using Kind = PickleValue::Kind;
using namespace test;

std::span<const std::uint8_t> bytes_of(const std::string& s) { return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()}; }

TEST(PickleWriter, ValuesReadBackThroughTheUnpickler) {
  const std::vector<std::int64_t> ints = {0, 1, 255, 256, 65535, 65536, -1, -128, -129, std::numeric_limits<std::int32_t>::min(),
                                          std::int64_t{std::numeric_limits<std::int32_t>::max()} + 1, -(std::int64_t{1} << 40),
                                          std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()};
  PickleWriter w;
  w.empty_dict().mark();
  w.string("ints").empty_list().mark();
  for (std::int64_t i : ints) w.integer(i);
  w.appends();
  w.string("real").real(-2.5e-7).string("none").none().string("yes").boolean(true).string("no").boolean(false);
  w.string("text").string("héllo\nworld").string("shape").int_tuple(std::vector<std::int64_t>{4, 5, 6, 7});
  w.string("args").global("argparse", "Namespace").empty_tuple().newobj().empty_dict().mark();
  w.string("lr").real(3e-4).string("num_layers").integer(12).setitems().build();
  w.setitems();
  const std::string pkl = w.finish();
  const Pickle p = unpickle(bytes_of(pkl), "test.pkl");
  const PickleValue& root = p.root();
  ASSERT_TRUE(root.is(Kind::kDict));
  const PickleValue* list = root.get("ints");
  ASSERT_TRUE(list && list->is(Kind::kList));
  ASSERT_EQ(list->items.size(), ints.size());
  for (std::size_t k = 0; k < ints.size(); ++k) EXPECT_EQ(list->items[k]->i, ints[k]) << k;
  EXPECT_EQ(root.get("real")->f, -2.5e-7);
  EXPECT_TRUE(root.get("none")->is(Kind::kNone));
  EXPECT_TRUE(root.get("yes")->b);
  EXPECT_FALSE(root.get("no")->b);
  EXPECT_EQ(root.get("text")->s, "héllo\nworld");
  const PickleValue* shape = root.get("shape");
  ASSERT_TRUE(shape->is(Kind::kTuple));
  ASSERT_EQ(shape->items.size(), 4u);
  EXPECT_EQ(shape->items[3]->i, 7);
  const PickleValue* args = root.get("args");
  ASSERT_TRUE(args && args->is(Kind::kDict));
  EXPECT_EQ(args->get("num_layers")->i, 12);
  EXPECT_EQ(args->get("lr")->f, 3e-4);
}

TEST(TorchArchive, TensorReadsBackWithTorchsLayout) {
  Tensor t = Tensor::zeros("t", {3, 5});
  for (std::size_t i = 0; i < t.f32().size(); ++i) t.f32()[i] = 0.25f * static_cast<float>(i) - 1.f;
  PickleWriter w;
  pickle_float_tensor(w, "0", t.shape);
  const TorchStorage storage{"0", t.bytes};
  std::string archive = "prefix";  // an archive starts anywhere inside a .distcp file
  const std::uint64_t size = write_torch_archive(w.finish(), {&storage, 1}, [&archive](std::span<const std::uint8_t> b) {
    archive.append(reinterpret_cast<const char*>(b.data()), b.size());
  });
  ASSERT_EQ(size, archive.size() - 6);
  const auto bytes = bytes_of(archive).subspan(6);
  const TorchFile f(bytes, "item");
  const Tensor back = f.tensor(f.root(), "t");
  EXPECT_EQ(back.shape, t.shape);
  EXPECT_EQ(back.bytes, t.bytes);
  const StoredZip zip(bytes, "item");
  EXPECT_EQ(zip.names(), (std::vector<std::string>{"archive/.data/serialization_id", "archive/.format_version", "archive/.storage_alignment",
                                                   "archive/byteorder", "archive/data.pkl", "archive/data/0", "archive/version"}));
  for (const std::string& name : zip.names()) EXPECT_EQ((zip.entry(name).data() - bytes.data()) % 64, 0) << name << " is not 64-byte aligned";
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(zip.entry("archive/version").data()), 2), "3\n");
}

TEST(TorchArchive, FlippedByteFailsTheCrc) {
  Tensor t = Tensor::zeros("t", {4});
  PickleWriter w;
  pickle_float_tensor(w, "0", t.shape);
  const TorchStorage storage{"0", t.bytes};
  std::string archive;
  write_torch_archive(w.finish(), {&storage, 1}, [&archive](std::span<const std::uint8_t> b) { archive.append(reinterpret_cast<const char*>(b.data()), b.size()); });
  const StoredZip zip(bytes_of(archive), "item");
  const std::size_t at = static_cast<std::size_t>(zip.entry("archive/data/0").data() - reinterpret_cast<const std::uint8_t*>(archive.data()));
  archive[at] ^= 0x01;
  const StoredZip bad(bytes_of(archive), "item");
  EXPECT_THROW(bad.entry("archive/data/0"), Error);
}

TEST(MegatronExport, ReadsBackAsTheSameModel) {
  for (const bool tied : {false, true}) {
    const auto dir = fresh_dir(tied ? "tied" : "untied");
    const ModelConfig c = small_config(true, tied);
    const TensorSet tensors = random_model(c, 11);
    const TrainingState state{.iteration = 42, .consumed_samples = 1344};
    const std::string out = save_megatron_torch_dist((dir / "meg").string(), c, tensors, state, {.tp = 2, .pp = 1});
    EXPECT_EQ(out, (dir / "meg" / "iter_0000042").string());
    EXPECT_EQ(read_text_file((dir / "meg" / "latest_checkpointed_iteration.txt").string()), "42");
    EXPECT_FALSE(std::filesystem::exists(dir / "meg" / "iter_0000042.tmp"));
    const MegatronCheckpoint m = load_megatron_torch_dist((dir / "meg").string());
    EXPECT_EQ(m.state.iteration, 42);
    EXPECT_EQ(m.state.consumed_samples, 1344);
    EXPECT_EQ(m.layout.tp, 2);
    EXPECT_EQ(m.config.padded_vocab_size(), c.padded_vocab_size());
    EXPECT_EQ(m.config.tie_word_embeddings, tied);
    ASSERT_EQ(m.tensors.size(), tensors.size());
    for (const auto& [name, t] : tensors) EXPECT_EQ(m.tensors.at(name).bytes, t.bytes) << name;
  }
}

TEST(MegatronExport, ConvertCarriesANativeCheckpointsTrainingState) {
  const auto dir = fresh_dir("native");
  const ModelConfig c = small_config();
  const TensorSet tensors = random_model(c, 8);
  save_checkpoint((dir / "native").string(), c, {.tp = 2, .pp = 1}, {tensors, {}, {}}, {.iteration = 7, .consumed_samples = 99});
  ConvertOptions o;
  o.from = CheckpointKind::kNative, o.to = CheckpointKind::kMegatron, o.megatron = {.tp = 2, .pp = 1};
  EXPECT_EQ(convert_checkpoint((dir / "native").string(), (dir / "meg").string(), o), (dir / "meg" / "iter_0000007").string());
  const MegatronCheckpoint m = load_megatron((dir / "meg").string());
  EXPECT_EQ(m.state.iteration, 7);
  EXPECT_EQ(m.state.consumed_samples, 99);
  for (const auto& [name, t] : tensors) EXPECT_EQ(m.tensors.at(name).bytes, t.bytes) << name;
}

TEST(MegatronExport, PadsTheVocabularyForTheTargetTp) {
  const auto dir = fresh_dir("pad");
  ModelConfig c = small_config(false, false);
  c.make_vocab_size_divisible_by = 7;  // 300 -> 301 rows; Megatron at TP 2 pads to a multiple of 14: 308
  const TensorSet tensors = random_model(c, 5);
  save_megatron_torch_dist((dir / "meg").string(), c, tensors, {}, {.tp = 2, .pp = 1});
  const MegatronCheckpoint m = load_megatron_torch_dist((dir / "meg").string());
  EXPECT_EQ(m.config.padded_vocab_size(), 308);
  for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    const Tensor& got = m.tensors.at(name);
    const Tensor& want = tensors.at(name);
    ASSERT_EQ(got.shape, (std::vector<std::int64_t>{308, c.hidden_size}));
    EXPECT_EQ(std::memcmp(got.bytes.data(), want.bytes.data(), want.bytes.size()), 0) << name;
    for (std::size_t i = want.bytes.size(); i < got.bytes.size(); ++i) ASSERT_EQ(got.bytes[i], 0) << name;
  }
}

TEST(MegatronExport, RefusesWhatMegatronCannotLoad) {
  const auto dir = fresh_dir("refuse");
  const ModelConfig c = small_config();
  TensorSet tensors = random_model(c, 3);
  auto message = [&](const TensorSet& t, MegatronExportOptions o, const std::string& root) {
    try {
      save_megatron_torch_dist((dir / root).string(), c, t, {.iteration = 7}, o);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  EXPECT_NE(message(tensors, {.tp = 3}, "a").find("target TP 3 must divide"), std::string::npos);
  EXPECT_NE(message(tensors, {.pp = 2}, "a").find("target PP 2 must divide num_layers 3"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "a" / "latest_checkpointed_iteration.txt"));
  EXPECT_EQ(message(tensors, {}, "b"), "no error");
  EXPECT_NE(message(tensors, {}, "b").find("exists already"), std::string::npos);
  TensorSet missing = tensors;
  missing.erase("decoder.layers.1.mlp.linear_fc2.weight");
  EXPECT_NE(message(missing, {}, "c").find("no tensor 'decoder.layers.1.mlp.linear_fc2.weight'"), std::string::npos);
  TensorSet extra = tensors;
  extra["decoder.layers.0.self_attention.linear_qkv.bias"] = Tensor::zeros("b", {4});
  EXPECT_NE(message(extra, {}, "d").find("'decoder.layers.0.self_attention.linear_qkv.bias' has no place"), std::string::npos);
}

}  // namespace
}  // namespace dlm::ckpt
