// The tokenizer against llama.cpp's test vectors (tests/test-tokenizer-0 format): every string
// of X.gguf.inp must give the ids of the same line of X.gguf.out (add_special = false,
// parse_special = false). Copied from ../shared/golden/tokenizer into tests/data/tokenizer.
#include "engine/tokenizer.h"

#include <filesystem>
#include <sstream>

#include "gguf/gguf_writer.h"
#include "test_util.h"

using namespace expertd::test;

namespace {

std::string data_dir() {
  return std::string(EXPERTD_SOURCE_DIR) + "/tests/data/tokenizer/";
}

// The vocab GGUF, or a copy decompressed from X.gguf.xz (llama.cpp's larger vocab files are kept
// compressed in tests/data).
std::string vocab_path(const std::string& name, TempDir& tmp) {
  if (name == "ggml-vocab-qwen35") {
    // llama.cpp's qwen35 vocab file is its qwen2 one with tokenizer.ggml.pre "qwen35" (checked
    // byte for byte): written here from the qwen2 copy rather than kept twice.
    auto q2 = gguf::Model::open(vocab_path("ggml-vocab-qwen2", tmp));
    EXPECT_TRUE(q2) << q2.error().message;
    gguf::Writer w(q2->alignment());
    for (const auto& kv : q2->kvs())
      if (kv.key != "tokenizer.ggml.pre") w.add_raw_kv(kv.raw);
    w.add_string("tokenizer.ggml.pre", "qwen35");
    auto h = w.header();
    const std::string out = tmp / "ggml-vocab-qwen35.gguf";
    write_file(out, std::string(h.begin(), h.end()));
    return out;
  }
  const std::string plain = data_dir() + name + ".gguf";
  if (std::filesystem::exists(plain)) return plain;
  const std::string out = tmp / (name + ".gguf");
  auto r = run("xz -dc " + plain + ".xz > " + out);
  EXPECT_EQ(r.first, 0) << "xz -dc " << plain << ".xz: " << r.second;
  return out;
}

void check_vocab(const std::string& name) {
  SCOPED_TRACE(name);
  TempDir tmp;
  auto f = gguf::Model::open(vocab_path(name, tmp));
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
    // (qwen35's .out has no space before the first id: compare the ids, not the spacing)
    auto trim = [](std::string v) {
      v.erase(0, v.find_first_not_of(' '));
      return v;
    };
    if (trim(got) != trim(lines[i]) && failures++ < 5)
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
// The rest of llama.cpp's tests/test-tokenizer-0 vocabularies (llama-cpp-python 0.3.36's
// models/ggml-vocab-*.gguf with their .inp/.out): BPE with the command-r, falcon, llama-bpe, mpt,
// qwen2, qwen35 (Qwen3.5), refact and starcoder pre-tokenizers. (llama.cpp registers 15 vocabs;
// the other two are gemma-4's and bert-bge's, tokenizer models the engine refuses: bert-bge's
// error is tested below, gemma-4's 16 MB vocab is not copied.)
TEST(Tokenizer, LlamaCppVocabVectors) {
  for (const char* v :
       {"command-r", "falcon", "llama-bpe", "mpt", "qwen2", "qwen35", "refact", "starcoder"})
    check_vocab(std::string("ggml-vocab-") + v);
}

// A tokenizer model the engine does not implement (BERT's WordPiece; llama.cpp's gemma4 too)
// is refused with an error naming it and the ones it does.
TEST(Tokenizer, UnsupportedTokenizerModelsGetAClearError) {
  TempDir tmp;
  auto f = gguf::Model::open(vocab_path("ggml-vocab-bert-bge", tmp));
  ASSERT_TRUE(f) << f.error().message;
  auto tok = engine::Tokenizer::load(*f);
  ASSERT_FALSE(tok);
  EXPECT_NE(tok.error().message.find("tokenizer model 'bert' is not supported (gpt2, llama)"),
            std::string::npos)
      << tok.error().message;
}

// llama.cpp's strip attributes: Phi-3's special tokens (and </s>) drop the whitespace after them,
// except <unk>, <s> and <|endoftext|>. Expected ids from llama.cpp (llama-cpp-python 0.3.36,
// vocab only, add_bos = false), with and without parse_special.
TEST(Tokenizer, Phi3SpecialTokensStripTheSpaceAfterThem) {
  auto f = gguf::Model::open(data_dir() + "ggml-vocab-phi-3.gguf");
  ASSERT_TRUE(f) << f.error().message;
  auto tok = engine::Tokenizer::load(*f);
  ASSERT_TRUE(tok) << tok.error().message;
  struct Case {
    const char* text;
    std::vector<int32_t> plain, special;
  };
  const Case cases[] = {
      {"</s> hello", {1533, 29879, 29958, 22172}, {2, 22172}},
      {"a </s>  b", {263, 1533, 29879, 29958, 29871, 289}, {263, 29871, 2, 289}},
      {"<|end|> \n x", {529, 29989, 355, 29989, 29958, 29871, 13, 921}, {32007, 921}},
      {"<|user|>  hi<|end|>",
       {529, 29989, 1792, 29989, 29958, 29871, 7251, 29966, 29989, 355, 29989, 29958},
       {32010, 7251, 32007}},
      {"<s> x", {529, 29879, 29958, 921}, {1, 29871, 921}},
      {"<unk> y", {529, 2960, 29958, 343}, {0, 29871, 343}},
      {"<|endoftext|> z", {529, 29989, 355, 974, 726, 29989, 29958, 503}, {32000, 29871, 503}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(tok->encode(c.text, false, false), c.plain) << c.text;
    EXPECT_EQ(tok->encode(c.text, false, true), c.special) << c.text << " (parse_special)";
  }
}

TEST(Tokenizer, SyntheticPreTokenizers) {
  for (const char* pre : {"qwen2", "olmo", "llama-bpe", "deepseek-v3", "gpt-4o"})
    check_vocab(std::string("ggml-vocab-synth-") + pre);
}

// The pre-tokenizers real GLM-4.x/GLM-5, Mistral Large 3, Solar-Open, MiniMax, Ling and K-EXAONE
// GGUFs name:
// the synthetic vocab with merges only some splits leave usable and whole-word tokens only
// llama.cpp's ignore-merges path takes (scripts/gen-pre-vocab.py, ids from llama.cpp).
TEST(Tokenizer, PreTokenizersOfTheLargeMoeFamilies) {
  for (const char* pre : {"glm4", "glm5", "tekken", "solar-open", "minimax-m2", "bailingmoe2",
                          "exaone-moe", "hunyuan", "hunyuan-dense", "hy_v4"}) {
    SCOPED_TRACE(pre);
    check_vocab(std::string("ggml-vocab-synth-") + pre);
  }
}

// Kimi-K2/K3's pre-tokenizer: the synthetic vocab with two merges only a split that keeps Han
// apart from other letters leaves unused, on the golden strings and mixed Latin/Han ones
// (scripts/gen-kimi-k2-vocab.py, ids from llama.cpp); and the same vocab without merges.
TEST(Tokenizer, KimiK2PreTokenizer) {
  check_vocab("ggml-vocab-synth-kimi-k2");
  auto f = gguf::Model::open(data_dir() + "ggml-vocab-synth-kimi-k2.gguf");
  ASSERT_TRUE(f);
  gguf::Writer w(f->alignment());
  for (const auto& kv : f->kvs())
    if (kv.key != "tokenizer.ggml.merges") w.add_raw_kv(kv.raw);
  auto h = w.header();
  TempDir tmp;
  write_file(tmp / "no-merges.gguf", std::string(h.begin(), h.end()));
  auto g = gguf::Model::open(tmp / "no-merges.gguf");
  ASSERT_TRUE(g) << g.error().message;
  auto tok = engine::Tokenizer::load(*g);
  ASSERT_TRUE(tok) << tok.error().message;
  auto ids = tok->encode("hello世界", false, false);
  EXPECT_EQ(ids.size(), std::string("hello世界").size());  // one byte-level symbol each
  std::string back;
  for (int32_t id : ids) back += tok->piece(id);
  EXPECT_EQ(back, "hello世界");
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
