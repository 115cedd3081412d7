// The tokenizer against llama.cpp's test vectors (tests/test-tokenizer-0 format): every string
// of X.gguf.inp must give the ids of the same line of X.gguf.out (add_special = false,
// parse_special = false). Copied from ../shared/golden/tokenizer into tests/data/tokenizer.
#include "engine/tokenizer.h"

#include <sstream>

#include "test_util.h"

using namespace expertd::test;

namespace {

std::string data_dir() {
  return std::string(EXPERTD_SOURCE_DIR) + "/tests/data/tokenizer/";
}

void check_vocab(const std::string& name) {
  SCOPED_TRACE(name);
  auto f = gguf::Model::open(data_dir() + name + ".gguf");
  ASSERT_TRUE(f) << f.error().message;
  auto tok = engine::Tokenizer::load(*f);
  ASSERT_TRUE(tok) << tok.error().message;
  std::string inp = read_file(data_dir() + name + ".gguf.inp"),
              outp = read_file(data_dir() + name + ".gguf.out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t at = 0;;) {
    size_t hit = inp.find(sep, at);
    if (hit == std::string::npos) break;
    texts.push_back(inp.substr(at, hit - at));
    at = hit + sep.size();
  }
  std::vector<std::string> lines;
  std::stringstream ss(outp);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  ASSERT_EQ(texts.size(), lines.size());
  int failures = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tok->encode(texts[i], false, false);
    std::string got;
    for (int32_t id : ids)
      got.append(" ").append(
          std::to_string(id));  // not " " + s: GCC 12 -O3 -Wrestrict false positive
    if (got != lines[i] && failures++ < 5)
      ADD_FAILURE() << "text #" << i << " '" << texts[i] << "'\n  want:" << lines[i]
                    << "\n  got: " << got;
    // Detokenizing gives the text back (byte-level BPE is lossless; SPM adds one leading space).
    std::string back;
    for (int32_t id : ids) back += tok->piece(id);
    if (tok->model() == "gpt2") {
      EXPECT_EQ(back, texts[i]) << "#" << i;
    }
  }
  EXPECT_EQ(failures, 0) << name << ": " << failures << " of " << texts.size() << " strings differ";
}

}  // namespace

TEST(Tokenizer, Gpt2Vectors) {
  check_vocab("ggml-vocab-gpt-2");
}
TEST(Tokenizer, DeepseekLlmVectors) {
  check_vocab("ggml-vocab-deepseek-llm");
}
TEST(Tokenizer, DeepseekCoderVectors) {
  check_vocab("ggml-vocab-deepseek-coder");
}
TEST(Tokenizer, LlamaSpmVectors) {
  check_vocab("ggml-vocab-llama-spm");
}
TEST(Tokenizer, Phi3SpmVectors) {
  check_vocab("ggml-vocab-phi-3");
}
TEST(Tokenizer, SyntheticPreTokenizers) {
  for (const char* pre : {"qwen2", "olmo", "llama-bpe", "deepseek-v3", "gpt-4o"})
    check_vocab(std::string("ggml-vocab-synth-") + pre);
}

TEST(Tokenizer, SpecialTokensAndUtf8Streaming) {
  auto f = gguf::Model::open(data_dir() + "ggml-vocab-synth-qwen2.gguf");
  ASSERT_TRUE(f);
  auto tok = engine::Tokenizer::load(*f);
  ASSERT_TRUE(tok);
  int32_t im_start = tok->find("<|im_start|>");
  ASSERT_GE(im_start, 0);
  auto with = tok->encode("<|im_start|>hi", false, true);
  ASSERT_FALSE(with.empty());
  EXPECT_EQ(with[0], im_start);
  auto without = tok->encode("<|im_start|>hi", false, false);
  EXPECT_NE(without[0], im_start);
  EXPECT_EQ(tok->encode("hi", true, false)[0], tok->bos());
  engine::Utf8Stream s;
  std::string euro = "\xE2\x82\xAC";  // three bytes
  EXPECT_EQ(s.push(euro.substr(0, 1)), "");
  EXPECT_EQ(s.push(euro.substr(1, 1)), "");
  EXPECT_EQ(s.push(euro.substr(2) + "a"), euro + "a");
  EXPECT_EQ(s.flush(), "");
}
