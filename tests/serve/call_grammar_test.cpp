// The grammar a forced tool call follows, compiled by xgrammar against a real vocabulary (the
// bundled model's) from a family's real template: the call as the template writes it is
// accepted token by token, after it nothing but the end of generation is allowed (and ends the
// grammar), arguments the tool's schema forbids are refused, and the parser reads the call back.
#include <gtest/gtest.h>

#include <cmath>

#include "serve/chat_request.h"
#include "test_util.h"

using namespace expertd;
using namespace expertd::serve;
using nlohmann::ordered_json;

namespace {

const ordered_json kWeather = ordered_json::parse(R"([{"type": "function", "function": {
  "name": "get_weather", "parameters": {"type": "object", "properties": {
  "city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
  "days": {"type": "integer", "minimum": 1, "maximum": 7},
  "note": {"type": "string"}}, "required": ["city", "days"]}}}])");

struct Vocab {
  explicit Vocab(engine::Tokenizer t) : tok(std::move(t)), grammars(tok) {}
  engine::Tokenizer tok;
  Grammars grammars;
};

Vocab& vocab() {
  static Vocab* v = [] {
    auto file = gguf::Model::open(std::string(EXPERTD_SOURCE_DIR) + "/model/kjv-moe-q8_0.gguf");
    if (!file) throw std::runtime_error(file.error().message);
    auto tok = engine::Tokenizer::load(*file);
    if (!tok) throw std::runtime_error(tok.error().message);
    return new Vocab(std::move(*tok));
  }();
  return *v;
}

chat::ReplyFormat format_of(const std::string& tmpl) {
  return chat::detect_reply_format(
      test::read_file(std::string(EXPERTD_SOURCE_DIR) + "/tests/data/templates/" + tmpl));
}

// A matcher of the forced call of get_weather in the family's syntax.
std::unique_ptr<Constraint> forced_call(const chat::ReplyFormat& f, const std::string& prefix,
                                        const ordered_json& tools = kWeather) {
  const GrammarSpec spec = call_grammar(f, tools, {ToolChoice::Mode::Required, ""}, prefix);
  auto g = vocab().grammars.compile(spec);
  if (!g) ADD_FAILURE() << g.error().message << "\n" << spec.text;
  return g ? std::make_unique<Constraint>(*g) : nullptr;
}

// How many bytes of `text` the grammar follows (all: text.size()), token by token.
size_t follows(Constraint& c, const std::string& text) {
  size_t at = 0;
  for (int32_t t : vocab().tok.encode(text, false, false)) {
    if (!c.accept(t)) return at;
    at += vocab().tok.piece(t, true).size();
  }
  return at;
}

// After a whole call: only end-of-generation tokens are allowed, and one ends the grammar.
void expect_only_the_end(Constraint& c) {
  const auto& tok = vocab().tok;
  std::vector<float> logits(size_t(tok.n_vocab()), 0.0f);
  c.mask(logits);
  int allowed = 0;
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (std::isfinite(logits[size_t(id)])) {
      ++allowed;
      EXPECT_TRUE(tok.is_end_of_generation(id)) << "'" << tok.piece(id, true) << "' allowed";
    }
  EXPECT_GT(allowed, 0);
  EXPECT_FALSE(c.terminated());
  ASSERT_TRUE(c.accept(tok.eos()));
  EXPECT_TRUE(c.terminated());
}

void expect_reads_back(const chat::ReplyFormat& f, const std::string& text,
                       const std::string& args) {
  chat::ParseOptions o;
  o.tools = kWeather;
  const chat::Reply r = chat::parse_reply(f, text, o);
  ASSERT_EQ(r.calls.size(), 1u) << text;
  EXPECT_TRUE(r.calls[0].complete);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(ordered_json::parse(r.calls[0].arguments), ordered_json::parse(args));
}

}  // namespace

TEST(CallGrammar, Hy3CallHoldsTheWholeSchemaAndEnds) {
  if (!grammars_available()) GTEST_SKIP() << "built without xgrammar";
  const auto f = format_of("tencent-Hy3.jinja");
  ASSERT_EQ(f.tools, chat::ToolSyntax::Hy3);
  auto arg = [](const std::string& k, const std::string& v) {
    return "<arg_key:opensource>" + k + "</arg_key:opensource>\n<arg_value:opensource>" + v +
           "</arg_value:opensource>\n";
  };
  const std::string open =
      "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n";
  const std::string close = "</tool_call:opensource>\n</tool_calls:opensource>";
  // As the template writes it: the string as it is, the integer as JSON; the optional one left
  // out or written.
  for (const std::string& args :
       {arg("city", "Rome") + arg("days", "3"),
        arg("city", "Paris") + arg("days", "7") + arg("note", "a <b> & \"c\"\nd")}) {
    const std::string text = open + args + close;
    auto c = forced_call(f, "");
    ASSERT_TRUE(c);
    ASSERT_EQ(follows(*c, text), text.size()) << text;
    expect_only_the_end(*c);
  }
  expect_reads_back(f, open + arg("city", "Paris") + arg("days", "7") + arg("note", "1") + close,
                    R"({"city": "Paris", "days": 7, "note": "1"})");
  // What the schema forbids: a city not in the enum, days out of range or quoted, a required
  // argument left out, one not in the schema, the arguments out of order.
  for (const std::string& bad :
       {arg("city", "Berlin"), arg("city", "Rome") + arg("days", "9"),
        arg("city", "Rome") + arg("days", "\"3\""), arg("city", "Rome") + close,
        arg("city", "Rome") + arg("days", "3") + arg("unit", "C"), arg("days", "3")}) {
    auto c = forced_call(f, "");
    ASSERT_TRUE(c);
    const std::string text = open + bad + close;
    EXPECT_LT(follows(*c, text), open.size() + bad.size()) << bad;
  }
  // A string's pattern; a tool whose schema names no properties takes any keys and text values.
  const ordered_json open_tools = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
     "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"]}}},
    {"type": "function", "function": {"name": "note"}}])");
  for (const auto& [text, ok] :
       {std::pair{open + arg("zip", "75001") + close, true},
        {open + arg("zip", "7500") + close, false},
        {open + arg("zip", "75001x") + close, false},
        {"<tool_calls:opensource>\n<tool_call:opensource>note<tool_sep:opensource>\n" +
             arg("any key", "any <text>") + arg("k2", "[1, 2]") + close,
         true},
        {"<tool_calls:opensource>\n<tool_call:opensource>note<tool_sep:opensource>\n" + close,
         true}}) {
    auto c = forced_call(f, "", open_tools);
    ASSERT_TRUE(c);
    if (!ok) {
      EXPECT_LT(follows(*c, text), text.size()) << text;
      continue;
    }
    ASSERT_EQ(follows(*c, text), text.size()) << text;
    expect_only_the_end(*c);
  }
  // After a reasoning block the prompt opened.
  auto c = forced_call(f, "</think:opensource>\n\n");
  const std::string text =
      "</think:opensource>\n\n" + open + arg("city", "Rome") + arg("days", "1") + close;
  ASSERT_EQ(follows(*c, text), text.size());
  expect_only_the_end(*c);
}

// Laguna and Ling 3.0: GLM's call in their turns; the forced call ends where the template's
// does, and then the turn ends (the end-of-turn token; the turn's end spelled out is the
// scheduler's turn_end), with the prompt's reasoning block open or closed.
TEST(CallGrammar, GlmCallsInTurnsEnd) {
  if (!grammars_available()) GTEST_SKIP() << "built without xgrammar";
  for (const auto& [t, turn_end] :
       {std::pair<std::string, std::string>{"poolside-Laguna-XS.2.jinja", "</assistant>"},
        {"poolside-Laguna-S-2.1.jinja", "</assistant>"},
        {"inclusionai-ling-3.0-flash.jinja", "<|role_end|>"}})
    for (bool in_reasoning : {false, true}) {
      SCOPED_TRACE(t + (in_reasoning ? ", reasoning open" : ""));
      const auto f = format_of(t);
      ASSERT_EQ(f.tools, chat::ToolSyntax::Glm);
      ASSERT_EQ(f.reply_end, turn_end);
      const std::string prefix = reply_prefix(f, in_reasoning);
      const std::string call =
          "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>London"
          "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n"
          "</tool_call>";
      auto c = forced_call(f, prefix);
      ASSERT_TRUE(c);
      ASSERT_EQ(follows(*c, prefix + call), prefix.size() + call.size());
      expect_only_the_end(*c);
      expect_reads_back(f, call + turn_end + "\n", R"({"city": "London", "days": 2})");
      auto bad = forced_call(f, prefix);
      const std::string over = prefix +
                               "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>London"
                               "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>8</arg_value>";
      EXPECT_LT(follows(*bad, over), over.size());
    }
}
