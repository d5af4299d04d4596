// The restricted unpickler and torch.save's zip files, against pickles Python wrote
// (tests/fuzz/corpus/torch_pickle/, made by make_pickle_fixtures.py).
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "dlm/ckpt/pickle.h"
#include "dlm/ckpt/torch_file.h"
#include "dlm/common/error.h"
#include "../../libckpt/megatron/megatron_args.h"
#include "test_util.h"

namespace dlm::ckpt {
namespace {

using Kind = PickleValue::Kind;
const std::string kDir = std::string(DLM_SOURCE_DIR) + "/tests/fuzz/corpus/torch_pickle/";

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

const PickleValue& at(const PickleValue& v, const char* key) {
  const PickleValue* x = v.get(key);
  EXPECT_NE(x, nullptr) << key;
  return *x;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class PlainPickle : public ::testing::TestWithParam<int> {};

TEST_P(PlainPickle, DecodesPythonValues) {
  const auto bytes = read_bytes(kDir + "plain_p" + std::to_string(GetParam()) + ".pkl");
  ASSERT_FALSE(bytes.empty());
  const Pickle p = unpickle(bytes, "plain.pkl");
  const PickleValue& r = p.root();
  ASSERT_TRUE(r.is(Kind::kDict));
  EXPECT_TRUE(at(r, "none").is(Kind::kNone));
  EXPECT_TRUE(at(r, "true").is(Kind::kBool) && at(r, "true").b);
  EXPECT_TRUE(at(r, "false").is(Kind::kBool) && !at(r, "false").b);
  const std::vector<std::int64_t> ints = {0, -1, 255, 65535, -(std::int64_t{1} << 31), std::int64_t{1} << 40, INT64_MIN, INT64_MAX};
  const PickleValue& li = at(r, "ints");
  ASSERT_EQ(li.items.size(), ints.size());
  for (std::size_t k = 0; k < ints.size(); ++k) EXPECT_EQ(li.items[k]->i, ints[k]) << k;
  EXPECT_EQ(at(r, "float").f, 1.5);
  EXPECT_EQ(at(r, "str").s, "h\xc3\xa9llo");
  EXPECT_TRUE(at(r, "bytes").is(Kind::kBytes));
  EXPECT_EQ(at(r, "bytes").s, std::string("\x00\xff\x80" "A", 4));
  const PickleValue& t = at(r, "tuple");
  ASSERT_TRUE(t.is(Kind::kTuple));
  ASSERT_EQ(t.items.size(), 3u);
  EXPECT_EQ(t.items[0]->i, 1);
  EXPECT_EQ(t.items[1]->s, "two");
  EXPECT_EQ(t.items[2]->f, 3.0);
  const PickleValue& od = at(r, "od");
  ASSERT_EQ(od.entries.size(), 2u);
  EXPECT_EQ(od.entries[0].first->s, "b");  // insertion order kept
  EXPECT_EQ(od.entries[0].second->i, 2);
  const PickleValue& ns = at(r, "ns");  // argparse.Namespace: a plain mapping
  ASSERT_TRUE(ns.is(Kind::kDict));
  EXPECT_EQ(at(ns, "lr").f, 3e-4);
  EXPECT_EQ(at(ns, "seq_length").i, 128);
  EXPECT_EQ(at(ns, "name").s, "gpt");
  const PickleValue& shared = at(r, "shared");  // the memo: both entries are the same list
  ASSERT_EQ(shared.items.size(), 2u);
  EXPECT_EQ(shared.items[0], shared.items[1]);
  EXPECT_EQ(shared.items[0]->items.size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Protocols, PlainPickle, ::testing::Values(2, 4, 5));

TEST(TorchFile, ReadsTensorsOfEveryLayout) {
  const TorchFile f(kDir + "tensors.pt");
  const PickleValue& r = f.root();
  auto values = [&](const char* key) {
    const Tensor t = f.tensor(at(r, key), key);
    return std::make_pair(t.shape, std::vector<float>(t.f32().begin(), t.f32().end()));
  };
  std::vector<float> base(24);
  for (int k = 0; k < 24; ++k) base[k] = static_cast<float>(k);
  EXPECT_EQ(values("f32").first, (std::vector<std::int64_t>{4, 6}));
  EXPECT_EQ(values("f32").second, base);
  std::vector<float> quarter(24), eighth(24), transposed(24), row2(base.begin() + 12, base.begin() + 18);
  for (int k = 0; k < 24; ++k) quarter[k] = k / 4.0f, eighth[k] = k / 8.0f;
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) transposed[i * 4 + j] = base[j * 6 + i];
  EXPECT_EQ(values("bf16").second, quarter);  // k/4 is exact in bf16 for k < 24
  EXPECT_EQ(values("f16").second, eighth);
  EXPECT_EQ(values("transposed").first, (std::vector<std::int64_t>{6, 4}));
  EXPECT_EQ(values("transposed").second, transposed);
  EXPECT_EQ(values("row2").second, row2);
  EXPECT_EQ(values("f64").second, (std::vector<float>{0.25f, -2.0f}));
  EXPECT_EQ(values("param").second, (std::vector<float>(4, 1.0f)));
  const PickleValue& args = at(r, "args");
  EXPECT_EQ(at(args, "iteration").i, 7);
  EXPECT_EQ(at(args, "params_dtype").s, "torch.bfloat16");
}

TEST(TorchFile, ReadsATensorWithPythonAttributes) {
  // torch._tensor._rebuild_from_type_v2 (megatron's fp32 masters): the tensor is read, its attributes dropped.
  const TorchFile f(kDir + "tensor_attributes.pt");
  const Tensor t = f.tensor(at(f.root(), "master"), "master");
  EXPECT_EQ(t.shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(std::vector<float>(t.f32().begin(), t.f32().end()), (std::vector<float>(3, 2.5f)));
}

TEST(Unpickler, RebuildFromTypeCallsOnlyATensorRebuild) {
  const auto bytes = read_bytes(kDir + "evil_rebuild_from_type.pkl");
  const std::string msg = error_of([&] { unpickle(bytes, "evil_rebuild_from_type.pkl"); });
  EXPECT_NE(msg.find("_rebuild_from_type_v2 names collections.OrderedDict and torch.Tensor, not a tensor rebuild"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(Unpickler, RefusesEveryOtherGlobalByName) {
  for (const auto& [file, global] : std::vector<std::pair<std::string, std::string>>{
           {"evil_os_system.pkl", "posix.system"}, {"evil_eval.pkl", "builtins.eval"}, {"evil_subprocess.pkl", "subprocess.Popen"}}) {
    const auto bytes = read_bytes(kDir + file);
    const std::string msg = error_of([&] { unpickle(bytes, file); });
    EXPECT_NE(msg.find("pickle names global " + global + ", which dlm does not load"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
}

TEST(Unpickler, TruncatedOrCorruptedInputIsOneLineError) {
  const auto bytes = read_bytes(kDir + "plain_p4.pkl");
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string msg = error_of([&] { unpickle(cut, "cut.pkl"); });
    EXPECT_TRUE(msg.starts_with("cut.pkl: offset ")) << n << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
  std::vector<std::uint8_t> bad = bytes;
  bad[bytes.size() / 2] = 0xfe;  // no such opcode or a broken length, depending on where it lands
  const std::string msg = error_of([&] { unpickle(bad, "bad.pkl"); });
  EXPECT_TRUE(msg.empty() || msg.starts_with("bad.pkl: offset ")) << msg;
}

TEST(TorchFile, CorruptedStorageFailsItsChecksum) {
  const auto dir = test::fresh_dir("pickle");
  auto bytes = read_bytes(kDir + "tensors.pt");
  // The first storage's bytes sit after its local header; flip a byte of data/0's payload.
  const std::string name = "tensors/data/0";
  const auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  ASSERT_NE(it, bytes.end());
  const std::size_t payload = static_cast<std::size_t>(it - bytes.begin()) + name.size();
  const std::size_t data_at = (payload + 63) / 64 * 64;  // torch aligns payloads to 64 bytes
  bytes[data_at + 1] ^= 0x40;
  const std::string path = (dir / "bad.pt").string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  const TorchFile f(path);
  const std::string msg = error_of([&] { f.tensor(at(f.root(), "f32"), "f32"); });
  EXPECT_NE(msg.find("fails its CRC-32 check"), std::string::npos) << msg;
  const std::string cut = (dir / "cut.pt").string();
  std::ofstream(cut, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() / 2));
  const std::string cut_msg = error_of([&] { TorchFile{cut}; });
  EXPECT_NE(cut_msg.find("not a zip archive"), std::string::npos) << cut_msg;
}

// Nested tuples that share one value through the memo: 2^40 leaves if walked naively.
TEST(Unpickler, SharedValuesStayLinear) {
  std::vector<std::uint8_t> b = {0x80, 2, ']', 'q', 0, '0'};
  for (int k = 0; k < 40; ++k) b.insert(b.end(), {'h', 0, 'h', 0, 0x86, 'q', 0, '0'});
  b.insert(b.end(), {'h', 0, '.'});
  const Pickle p = unpickle(b, "laughs.pkl");
  const std::string text = detail::pickle_to_json(p.root()).dump();
  EXPECT_LT(text.size(), std::size_t{64} << 20);
  EXPECT_NE(text.find("<truncated>"), std::string::npos);
}

// The fuzzer's find: dicts keyed by dicts were rendered as JSON keys, escaped again at every level.
TEST(Unpickler, NonStringKeysStayShort) {
  const auto bytes = read_bytes(kDir + "crash_nested_keys.pkl");
  const Pickle p = unpickle(bytes, "crash_nested_keys.pkl");
  EXPECT_LT(detail::pickle_to_json(p.root()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size(), std::size_t{1} << 20);
}

}  // namespace
}  // namespace dlm::ckpt
