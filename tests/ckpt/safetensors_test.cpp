#include "dlm/ckpt/safetensors.h"

#include <bit>
#include <cstring>
#include <fstream>

#include <gtest/gtest.h>

#include "dlm/common/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace dlm::ckpt;

namespace {

std::vector<std::uint8_t> image(const std::string& header, std::size_t data_bytes) {
  std::vector<std::uint8_t> out(8 + header.size() + data_bytes, 0);
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string error_of(const std::vector<std::uint8_t>& bytes) {
  try {
    parse_safetensors(bytes, "x.safetensors");
  } catch (const dlm::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, WriteReadRoundTripIsZeroCopyAndAligned) {
  const auto dir = test::fresh_dir("st");
  Tensor a = Tensor::zeros("a", {2, 3});
  for (int i = 0; i < 6; ++i) a.f32()[i] = 0.5f * i;
  Tensor b = convert(a.view(), TensorDType::kBFloat16);
  b.name = "b.weight";
  Tensor empty = Tensor::zeros("e", {0, 4});
  const std::vector<TensorView> views{a.view(), b.view(), empty.view()};
  const std::string path = (dir / "m.safetensors").string();
  write_safetensors(path, views, {{"format", "pt"}});
  SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const TensorView* ra = f.find("a");
  ASSERT_NE(ra, nullptr);
  EXPECT_EQ(ra->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(ra->bytes.data(), a.bytes.data(), 24), 0);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ra->bytes.data()) % 8, 0u);
  EXPECT_EQ(f.find("b.weight")->dtype, TensorDType::kBFloat16);
  EXPECT_EQ(convert(*f.find("b.weight"), TensorDType::kFloat32).f32()[5], 2.5f);
  EXPECT_EQ(f.find("e")->bytes.size(), 0u);
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, Bf16RoundsToNearestEven) {
  Tensor t = Tensor::zeros("t", {3});
  t.f32()[0] = std::bit_cast<float>(0x3f808000u);  // exactly halfway, lower kept bit 0 -> down
  t.f32()[1] = std::bit_cast<float>(0x3f818000u);  // halfway, kept bit 1 -> up
  t.f32()[2] = std::bit_cast<float>(0x3f808001u);  // above halfway -> up
  Tensor b = convert(t.view(), TensorDType::kBFloat16);
  const auto* h = reinterpret_cast<const std::uint16_t*>(b.bytes.data());
  EXPECT_EQ(h[0], 0x3f80);
  EXPECT_EQ(h[1], 0x3f82);
  EXPECT_EQ(h[2], 0x3f81);
  Tensor f16 = convert(t.view(), TensorDType::kFloat16);
  EXPECT_EQ(convert(f16.view(), TensorDType::kFloat32).f32()[0], 1.00390625f);  // 1 + 2^-8 fits a half
}

TEST(Safetensors, BadInputsNameTheProblem) {
  EXPECT_NE(error_of({1, 2, 3}).find("truncated"), std::string::npos);
  auto past = image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  past[0] = 0xff;
  EXPECT_NE(error_of(past).find("runs past the end"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4)).find("past the end of the data"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 12)).find("overlaps"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", 4)).find("unknown dtype 'Q7'"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8)).find("unsupported dtype 'I64'"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)).find("need 12"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)).find("gap"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6)).find("2 bytes after"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", 4)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"__metadata__":7e554})", 0)).find("not valid JSON"), std::string::npos);  // found by the fuzzer
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)).find("negative"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})", 4)).find("overflows"), std::string::npos);
  EXPECT_NE(error_of(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4)), "x");
  EXPECT_EQ(error_of(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4)), "");
}

TEST(Safetensors, TruncatedFileOnDisk) {
  const auto dir = test::fresh_dir("st");
  Tensor a = Tensor::zeros("a", {64});
  const std::vector<TensorView> views{a.view()};
  const std::string path = (dir / "m.safetensors").string();
  write_safetensors(path, views);
  fs::resize_file(path, fs::file_size(path) - 10);
  try {
    SafetensorsFile f(path);
    FAIL() << "truncated file accepted";
  } catch (const dlm::Error& e) {
    EXPECT_EQ(e.where().file, path);
    EXPECT_NE(std::string(e.what()).find("past the end of the data"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, ShardedFolderWithIndex) {
  const auto dir = test::fresh_dir("st");
  TensorSet s;
  std::vector<TensorView> views;
  for (int i = 0; i < 5; ++i) {
    Tensor t = Tensor::zeros("t" + std::to_string(i), {100});
    t.f32()[0] = static_cast<float>(i);
    s[t.name] = std::move(t);
  }
  for (auto& [n, t] : s) views.push_back(t.view());
  const auto files = write_safetensors_folder(dir.string(), views, 900);
  EXPECT_EQ(files.size(), 3u);
  EXPECT_TRUE(fs::exists(dir / "model-00003-of-00003.safetensors"));
  SafetensorsFolder folder(dir.string());
  ASSERT_EQ(folder.tensors().size(), 5u);
  EXPECT_EQ(convert(*folder.find("t3"), TensorDType::kFloat32).f32()[0], 3.f);
  fs::remove(dir / "model-00002-of-00003.safetensors");
  try {
    SafetensorsFolder broken(dir.string());
    FAIL() << "missing shard accepted";
  } catch (const dlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00003.safetensors' is missing"), std::string::npos) << e.what();
  }
}

}  // namespace
