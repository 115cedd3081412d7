#include "gguf/gguf_reader.h"

#include <cstring>

#include "common/fd.h"
#include "gguf/gguf_writer.h"
#include "test_util.h"

using namespace expertd;
using namespace expertd::test;

namespace {

// A small valid GGUF written by our writer: one KV of each kind and two tensors.
std::string small_gguf(const std::string& path, uint32_t type_id_override = 0) {
  gguf::Writer w(32);
  w.add_string("general.architecture", "qwen3moe");
  w.add_u32("qwen3moe.expert_count", 4);
  w.add_f32("qwen3moe.rope.freq_base", 10000.0f);
  w.add_bool("tokenizer.ggml.add_bos_token", false);
  w.add_u64("test.u64", 1ull << 40);
  w.add_i32("test.i32", -7);
  w.add_string_array("tokenizer.ggml.tokens", {"a", "bc", ""});
  w.add_f32_array("test.f32s", {1.5f, -2.0f});
  w.add_tensor("a.weight", gguf::GgmlType::F32, {8, 2});
  w.add_tensor("b.weight", gguf::GgmlType::Q8_0, {64, 3});
  auto h = w.header();
  std::string data(w.file_bytes(), '\0');
  std::memcpy(data.data(), h.data(), h.size());
  for (size_t i = h.size(); i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  if (type_id_override) {
    // Patch the type of the last tensor info: it sits 12 bytes before the end of the infos.
    size_t pos = data.find("b.weight") + 8 + 4 + 16;
    std::memcpy(data.data() + pos, &type_id_override, 4);
  }
  write_file(path, data);
  return data;
}

}  // namespace

TEST(GgufReader, ReadsWhatTheWriterWrote) {
  TempDir d;
  std::string data = small_gguf(d / "m.gguf");
  auto m = gguf::Model::open(d / "m.gguf");
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->version(), 3u);
  EXPECT_EQ(m->arch(), "qwen3moe");
  EXPECT_EQ(m->get_uint("qwen3moe.expert_count"), 4u);
  EXPECT_FLOAT_EQ(*m->get_float("qwen3moe.rope.freq_base"), 10000.0f);
  EXPECT_EQ(m->get_bool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(m->get_uint("test.u64"), 1ull << 40);
  EXPECT_EQ(m->get_int("test.i32"), -7);
  EXPECT_FALSE(m->get_uint("test.i32").has_value());  // negative is not a uint
  auto toks = m->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(toks);
  EXPECT_EQ((std::vector<std::string>(toks->begin(), toks->end())),
            (std::vector<std::string>{"a", "bc", ""}));
  EXPECT_EQ(*m->get_number_array("test.f32s"), (std::vector<double>{1.5, -2.0}));
  const auto* b = m->tensor("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, gguf::GgmlType::Q8_0);
  EXPECT_EQ(b->nbytes, 3u * 2 * 34);
  EXPECT_EQ(b->file_offset % 32, 0u);
  EXPECT_EQ(0, std::memcmp(b->data, data.data() + b->file_offset, b->nbytes));
}

TEST(GgufReader, OpensEveryGoldenModel) {
  REQUIRE_GOLDEN();
  for (const auto& c : golden_cases()) {
    auto m = gguf::Model::open(golden_model(c));
    ASSERT_TRUE(m) << c << ": " << m.error().message;
    EXPECT_FALSE(m->arch().empty()) << c;
    EXPECT_GT(m->tensors().size(), 10u) << c;
    std::string a = m->arch();
    EXPECT_TRUE(m->get_uint(a + ".expert_count").has_value()) << c;
    for (const auto& t : m->tensors())
      EXPECT_LE(t.file_offset + t.nbytes, m->shards()[0].size) << c << " " << t.name;
  }
}

TEST(GgufReader, EveryTruncationIsAnErrorNamingTheFile) {
  TempDir d;
  std::string data = small_gguf(d / "m.gguf");
  auto full = gguf::Model::open(d / "m.gguf");
  ASSERT_TRUE(full);
  uint64_t end = 0;  // past the last tensor only alignment padding follows
  for (const auto& t : full->tensors()) end = std::max(end, t.file_offset + t.nbytes);
  for (size_t len = 0; len < end; ++len) {
    write_file(d / "t.gguf", data.substr(0, len));
    auto m = gguf::Model::open(d / "t.gguf");
    ASSERT_FALSE(m) << "truncated to " << len << " bytes was accepted";
    EXPECT_NE(m.error().message.find("t.gguf"), std::string::npos) << m.error().message;
  }
}

TEST(GgufReader, HostileHeadersAreRejected) {
  TempDir d;
  std::string good = small_gguf(d / "m.gguf");
  auto expect_error = [&](std::string bytes, const std::string& needle) {
    write_file(d / "h.gguf", bytes);
    auto m = gguf::Model::open(d / "h.gguf");
    ASSERT_FALSE(m) << "accepted; expected: " << needle;
    EXPECT_NE(m.error().message.find(needle), std::string::npos) << m.error().message;
  };
  std::string b = good;
  b[0] = 'X';
  expect_error(b, "not a GGUF");
  b = good;
  uint32_t v = 99;
  std::memcpy(b.data() + 4, &v, 4);
  expect_error(b, "unsupported GGUF version");
  b = good;
  uint64_t huge = 1ull << 40;
  std::memcpy(b.data() + 8, &huge, 8);
  expect_error(b, "tensor count");
  b = good;
  std::memcpy(b.data() + 16, &huge, 8);
  expect_error(b, "key/value count");
  b = good;
  std::memcpy(b.data() + 24, &huge, 8);  // the first key's length
  expect_error(b, "length");
  // A tensor whose offset points past the end of the file.
  b = good;
  size_t pos = b.find("b.weight") + 8 + 4 + 16 + 4;
  uint64_t far = 1ull << 30;
  std::memcpy(b.data() + pos, &far, 8);
  expect_error(b, "beyond the end of the file");
  // A tensor whose dimension does not fit its type's blocks.
  b = good;
  uint64_t ne0 = 33;
  std::memcpy(b.data() + b.find("b.weight") + 8 + 4, &ne0, 8);
  expect_error(b, "not a multiple");
  small_gguf(d / "u.gguf", 77);
  auto m = gguf::Model::open(d / "u.gguf");
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message.find("unknown ggml type 77"), std::string::npos) << m.error().message;
  write_file(d / "empty.gguf", "");
  EXPECT_FALSE(gguf::Model::open(d / "empty.gguf"));
  EXPECT_FALSE(gguf::Model::open(d / "missing.gguf"));
}

TEST(GgufReader, SplitPathsFollowLlamaCppNaming) {
  auto p = gguf::split_paths("/m/Qwen3-00001-of-00003.gguf", 3);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[2], "/m/Qwen3-00003-of-00003.gguf");
  EXPECT_EQ(gguf::split_paths("/m/model.gguf", 1).size(), 1u);
}
