// Replies taken apart per model family. The outputs are llama.cpp's own test vectors
// (tests/test-chat.cpp of the llama.cpp in llama-cpp-python 0.3.36), read with the family the
// real template (tests/data/templates) is detected as; arguments are compared as JSON values.
// Every vector is also parsed cut at every byte as a reply still being generated: each partial
// parse must show a prefix of the finished parse's reasoning and answer, and no more calls.
#include "chat/reply.h"

#include <gtest/gtest.h>

#include "test_util.h"

using namespace expertd::chat;
using nlohmann::ordered_json;

namespace {

ReplyFormat format_of(const std::string& tmpl) {
  return detect_reply_format(
      expertd::test::read_file(std::string(EXPERTD_SOURCE_DIR) + "/tests/data/templates/" + tmpl));
}

struct Want {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (JSON)
};

const ordered_json kTools = ordered_json::parse(R"([
  {"type": "function", "function": {"name": "special_function",
   "parameters": {"type": "object", "properties": {"arg1": {"type": "integer"}}}}},
  {"type": "function", "function": {"name": "get_time",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "get_weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");

void expect_reply(const std::string& tmpl, ToolSyntax syntax, const std::string& text,
                  const Want& want, bool in_reasoning = false, const ordered_json& tools = kTools) {
  SCOPED_TRACE(tmpl + ": " + text);
  const ReplyFormat f = format_of(tmpl);
  ASSERT_EQ(syntax_name(f.tools), std::string(syntax_name(syntax)));
  ParseOptions o;
  o.starts_in_reasoning = in_reasoning;
  o.tools = tools;
  const Reply r = parse_reply(f, text, o);
  EXPECT_EQ(r.reasoning, want.reasoning);
  EXPECT_EQ(r.content, want.content);
  ASSERT_EQ(r.calls.size(), want.calls.size());
  for (size_t i = 0; i < r.calls.size(); ++i) {
    EXPECT_EQ(r.calls[i].name, want.calls[i].first);
    EXPECT_TRUE(r.calls[i].complete);
    EXPECT_EQ(ordered_json::parse(r.calls[i].arguments), ordered_json::parse(want.calls[i].second));
  }
  // Cut at every byte: a prefix of the finished parse, and calls only as they are written.
  o.partial = true;
  for (size_t n = 0; n <= text.size(); ++n) {
    const Reply p = parse_reply(f, std::string_view(text).substr(0, n), o);
    ASSERT_EQ(r.reasoning.compare(0, p.reasoning.size(), p.reasoning), 0) << "cut at " << n;
    ASSERT_EQ(r.content.compare(0, p.content.size(), p.content), 0)
        << "cut at " << n << ": '" << p.content << "'";
    ASSERT_LE(p.calls.size(), r.calls.size()) << "cut at " << n;
    for (size_t i = 0; i < p.calls.size(); ++i) {
      if (p.calls[i].complete) {
        ASSERT_EQ(p.calls[i].arguments, r.calls[i].arguments) << "cut at " << n;
      }
      if (!p.calls[i].name.empty()) {
        ASSERT_EQ(r.calls[i].name.compare(0, p.calls[i].name.size(), p.calls[i].name), 0);
      }
    }
  }
}

}  // namespace

TEST(Reply, Qwen3HermesCalls) {
  const std::string t = "Qwen-Qwen3-0.6B.jinja";
  expect_reply(t, ToolSyntax::Hermes, "Hello, world!\nWhat's up?",
               {"", "Hello, world!\nWhat's up?"});
  expect_reply(
      t, ToolSyntax::Hermes,
      "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>",
      {"", "", {{"special_function", R"({"arg1": 1})"}}});
  expect_reply(t, ToolSyntax::Hermes,
               "<think>I'm\nthinking</think>\n\nLet me see.\n<tool_call>\n{\"name\": \"get_time\", "
               "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
               "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
               {"I'm\nthinking",
                "Let me see.",
                {{"get_time", R"({"city": "Paris"})"}, {"get_weather", R"({"city": "Paris"})"}}});
}

TEST(Reply, Qwen3CoderXmlCalls) {
  const std::string t = "Qwen3-Coder.jinja";
  expect_reply(t, ToolSyntax::Qwen3Coder, "Hello, world!\nWhat's up?",
               {"", "Hello, world!\nWhat's up?"});
  expect_reply(t, ToolSyntax::Qwen3Coder,
               "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n"
               "</function>\n</tool_call>",
               {"", "", {{"special_function", R"({"arg1": 1})"}}});
  // Some models skip the opening <tool_call> (llama.cpp's vector).
  expect_reply(t, ToolSyntax::Qwen3Coder,
               "Let me call it.\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n"
               "</function>\n</tool_call>",
               {"", "Let me call it.", {{"special_function", R"({"arg1": 1})"}}});
  expect_reply(t, ToolSyntax::Qwen3Coder,
               "<tool_call>\n<function=get_time>\n<parameter=city>\n\nParis \n\n</parameter>\n"
               "</function>\n</tool_call>",
               {"", "", {{"get_time", R"({"city": "Paris"})"}}});
}

TEST(Reply, GlmArgKeyCalls) {
  expect_reply("GLM-4.6.jinja", ToolSyntax::Glm,
               "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n"
               "</tool_call>",
               {"", "", {{"special_function", R"({"arg1": 1})"}}});
  expect_reply("GLM-4.7-Flash.jinja", ToolSyntax::Glm,
               "I'm\nthinking</think>Hello, world!\nWhat's up?",
               {"I'm\nthinking", "Hello, world!\nWhat's up?"}, true);
  // A string-typed parameter stays a string even when it reads as JSON.
  expect_reply(
      "GLM-4.6.jinja", ToolSyntax::Glm,
      "<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>1234</arg_value>\n</tool_call>",
      {"", "", {{"get_time", R"({"city": "1234"})"}}});
}

TEST(Reply, KimiK2SectionCalls) {
  const std::string t = "Kimi-K2-Thinking.jinja";
  expect_reply(t, ToolSyntax::KimiK2, "Hello, world!\nWhat's up?",
               {"", "Hello, world!\nWhat's up?"});
  expect_reply(
      t, ToolSyntax::KimiK2,
      "<think>I'm thinking about this</think><|tool_calls_section_begin|><|tool_call_begin|>"
      "functions.special_function:0<|tool_call_argument_begin|>{\"arg1\": 1}"
      "<|tool_call_end|><|tool_calls_section_end|>",
      {"I'm thinking about this", "", {{"special_function", R"({"arg1": 1})"}}});
  expect_reply(
      "Kimi-K2-Instruct.jinja", ToolSyntax::KimiK2,
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
      "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>"
      "functions.get_weather:1<|tool_call_argument_begin|>{\"city\": \"Paris\"}"
      "<|tool_call_end|><|tool_calls_section_end|>",
      {"", "", {{"get_time", R"({"city": "Paris"})"}, {"get_weather", R"({"city": "Paris"})"}}});
}

TEST(Reply, KimiK3XtmlCalls) {
  const std::string t = "Kimi-K3.jinja";
  expect_reply(t, ToolSyntax::KimiK3,
               "<|open|>response<|sep|>Hello, world!\nWhat's up?<|close|>response<|sep|>"
               "<|close|>message<|sep|>",
               {"", "Hello, world!\nWhat's up?"});
  expect_reply(t, ToolSyntax::KimiK3,
               "I'm thinking about this<|close|>think<|sep|><|open|>response<|sep|>Hello, world!\n"
               "What's up?<|close|>response<|sep|><|close|>message<|sep|>",
               {"I'm thinking about this", "Hello, world!\nWhat's up?"}, true);
  expect_reply(t, ToolSyntax::KimiK3,
               "<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
               "<|open|>call tool=\"special_function\" index=\"1\"<|sep|>"
               "<|open|>argument key=\"arg1\" type=\"number\"<|sep|>1<|close|>argument<|sep|>"
               "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>",
               {"", "", {{"special_function", R"({"arg1": 1})"}}});
  // Blank lines between the tags and around the values (what a grammar may let through).
  expect_reply(t, ToolSyntax::KimiK3,
               "<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
               "<|open|>call tool=\"get_time\" index=\"1\"<|sep|>\n\n"
               "<|open|>argument key=\"city\" type=\"string\"<|sep|>\n\nRome\n\n"
               "<|close|>argument<|sep|>\n\n<|close|>call<|sep|><|close|>tools<|sep|>",
               {"", "", {{"get_time", R"({"city": "Rome"})"}}});
}

TEST(Reply, DeepSeekV31Calls) {
  const std::string t = "deepseek-ai-DeepSeek-V3.1.jinja";
  expect_reply(t, ToolSyntax::DeepSeekV3,
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": "
               "\"XYZCITY\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
               {"", "", {{"get_time", R"({"city":"XYZCITY"})"}}});
  expect_reply(
      t, ToolSyntax::DeepSeekV3,
      "REASONING</think>CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
      "{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
      "{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      {"REASONING",
       "CONTENT",
       {{"get_time", R"({"city":"Paris"})"}, {"get_weather", R"({"city":"Paris"})"}}},
      true);
}

TEST(Reply, DeepSeekV4DsmlCalls) {
  const std::string t = "deepseek-ai-DeepSeek-V4.jinja";
  expect_reply(t, ToolSyntax::DeepSeekDsml, "I'm\nthinking</think>Hello, world!\nWhat's up?",
               {"I'm\nthinking", "Hello, world!\nWhat's up?"}, true);
  expect_reply(
      t, ToolSyntax::DeepSeekDsml,
      "Let me check the time</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_time\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Tokyo</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      {"Let me check the time", "", {{"get_time", R"({"city": "Tokyo"})"}}}, true);
  expect_reply(t, ToolSyntax::DeepSeekDsml,
               "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"special_function\">\n"
               "<｜DSML｜parameter name=\"arg1\" string=\"false\">1</｜DSML｜parameter>\n"
               "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
               {"", "", {{"special_function", R"({"arg1": 1})"}}});
}

TEST(Reply, GptOssHarmonyChannels) {
  const std::string t = "openai-gpt-oss-120b.jinja";
  expect_reply(t, ToolSyntax::Harmony, "<|channel|>final<|message|>Hello, world!\nWhat's up?",
               {"", "Hello, world!\nWhat's up?"});
  expect_reply(
      t, ToolSyntax::Harmony,
      "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final"
      "<|message|>Hello, world!\nWhat's up?",
      {"I'm\nthinking", "Hello, world!\nWhat's up?"});
  expect_reply(t, ToolSyntax::Harmony,
               " to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
               {"", "", {{"special_function", R"({"arg1": 1})"}}});
  expect_reply(t, ToolSyntax::Harmony,
               "<|channel|>analysis<|message|>Let me call it<|end|><|start|>assistant<|channel|>"
               "commentary to=functions.special_function <|constrain|>json<|message|>{\"arg1\": 1}",
               {"Let me call it", "", {{"special_function", R"({"arg1": 1})"}}});
}

TEST(Reply, AnUnfinishedCallIsReportedUnfinished) {
  const ReplyFormat f = format_of("Qwen-Qwen3-0.6B.jinja");
  ParseOptions o;
  const Reply r = parse_reply(
      f, "Sure.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Par", o);
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_FALSE(r.calls[0].complete);
  EXPECT_EQ(r.calls[0].name, "get_time");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Par");
}

TEST(Reply, MalformedCallsStayTheAnswer) {
  const ReplyFormat f = format_of("Qwen-Qwen3-0.6B.jinja");
  const Reply r = parse_reply(f, "Look: <tool_call>not json</tool_call> done", {});
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "Look: <tool_call>not json</tool_call> done");
}

// MiniMax-M2 (llama.cpp's test-chat.cpp vectors): reasoning closed by </think>, then an answer or
// a <minimax:tool_call> section of <invoke>s whose parameters are typed by the tool's schema.
TEST(Reply, MiniMaxInvokeCalls) {
  const std::string t = "MiniMax-M2.jinja";
  expect_reply(t, ToolSyntax::MiniMax, "\n</think>\n\nHello, world!\nWhat's up?",
               {"", "Hello, world!\nWhat's up?"}, true);
  expect_reply(t, ToolSyntax::MiniMax, "I'm\nthinking\n</think>\n\nHello, world!\nWhat's up?",
               {"I'm\nthinking", "Hello, world!\nWhat's up?"}, true);
  expect_reply(t, ToolSyntax::MiniMax,
               "\n</think>\n\n<minimax:tool_call>\n<invoke name=\"special_function\">\n<parameter "
               "name=\"arg1\">1</parameter>\n</invoke>\n</minimax:tool_call>",
               {"", "", {{"special_function", R"({"arg1": 1})"}}}, true);
  expect_reply(
      t, ToolSyntax::MiniMax,
      "Let's call a tool:\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_time\">\n"
      "</invoke>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">\n1234 \n</parameter>\n"
      "</invoke>\n</minimax:tool_call>",
      {"Let's call a tool:", "", {{"get_time", "{}"}, {"get_weather", R"({"city": "1234"})"}}},
      true);
  const CallShape s = call_shape(format_of(t), "get_time");
  EXPECT_EQ(s.begin, "<minimax:tool_call>\n<invoke name=\"get_time\">\n");
  EXPECT_EQ(s.style, "minimax_xml");
}

// Hy3 (tencent-Hy3.jinja): every marker carries the suffix the template sets once (HYTK,
// ":opensource"); the arguments are GLM's arg_key/arg_value pairs, strings as written and other
// values as JSON. llama.cpp reads it with its automatic parser and has no vectors of its own for
// it, so these are test-chat.cpp's generic vectors in Hy3's syntax, the calls as the real template
// renders them (Jinja2).
TEST(Reply, Hy3SuffixedCalls) {
  const std::string t = "tencent-Hy3.jinja";
  const auto S = ToolSyntax::Hy3;
  expect_reply(t, S, "Hello, world!\nWhat's up?", {"", "Hello, world!\nWhat's up?"});
  // reasoning_effort high: the prompt opens the reasoning block.
  expect_reply(t, S, "I'm\nthinking</think:opensource>Hello, world!\nWhat's up?",
               {"I'm\nthinking", "Hello, world!\nWhat's up?"}, true);
  expect_reply(t, S,
               "<tool_calls:opensource>\n<tool_call:opensource>special_function"
               "<tool_sep:opensource>\n<arg_key:opensource>arg1</arg_key:opensource>\n"
               "<arg_value:opensource>1</arg_value:opensource>\n</tool_call:opensource>\n"
               "</tool_calls:opensource>",
               {"", "", {{"special_function", R"({"arg1": 1})"}}});
  expect_reply(
      t, S,
      "<think:opensource>I'm\nthinking</think:opensource>Let me see.<tool_calls:opensource>\n"
      "<tool_call:opensource>special_function<tool_sep:opensource>\n<arg_key:opensource>arg1"
      "</arg_key:opensource>\n<arg_value:opensource>1</arg_value:opensource>\n"
      "</tool_call:opensource>\n<tool_call:opensource>get_time<tool_sep:opensource>\n"
      "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris"
      "</arg_value:opensource>\n<arg_key:opensource>n</arg_key:opensource>\n"
      "<arg_value:opensource>[1, 2]</arg_value:opensource>\n</tool_call:opensource>\n"
      "</tool_calls:opensource>",
      {"I'm\nthinking",
       "Let me see.",
       {{"special_function", R"({"arg1": 1})"},
        {"get_time", R"({"city": "Paris", "n": [1, 2]})"}}});
  // A string-typed parameter stays a string even when it reads as JSON; a call without
  // arguments.
  expect_reply(t, S,
               "<tool_calls:opensource>\n<tool_call:opensource>get_time<tool_sep:opensource>\n"
               "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>1234"
               "</arg_value:opensource>\n</tool_call:opensource>\n<tool_call:opensource>"
               "get_weather<tool_sep:opensource>\n</tool_call:opensource>\n"
               "</tool_calls:opensource>",
               {"", "", {{"get_time", R"({"city": "1234"})"}, {"get_weather", "{}"}}});
  // GLM's markers without the suffix are no calls of Hy3's.
  expect_reply(t, S, "<tool_call>get_time\n</tool_call>",
               {"", "<tool_call>get_time\n</tool_call>"});

  const ReplyFormat f = format_of(t);
  EXPECT_EQ(f.family, "hy3");
  EXPECT_EQ(f.tag_suffix, ":opensource");
  EXPECT_TRUE(prompt_opens_reasoning(f, "<｜hy_Assistant:opensource｜><think:opensource>"));
  EXPECT_FALSE(prompt_opens_reasoning(
      f, "<｜hy_Assistant:opensource｜><think:opensource></think:opensource>"));
  // xgrammar has no style for these markers: the shape names them for serve's own grammar.
  const CallShape s = call_shape(f, "get_time");
  EXPECT_EQ(s.begin,
            "<tool_calls:opensource>\n<tool_call:opensource>get_time<tool_sep:opensource>\n");
  EXPECT_EQ(s.style, "");
  EXPECT_EQ(s.end, "</tool_call:opensource>\n</tool_calls:opensource>");
  EXPECT_EQ(s.key_open + "city" + s.key_close + s.blank + s.value_open + "Paris" + s.value_close +
                s.blank,
            "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris"
            "</arg_value:opensource>\n");
}

// Laguna (poolside): GLM's calls in <assistant>..</assistant> turns. llama.cpp reads it with its
// automatic parser patched for Laguna (test-chat-auto-parser.cpp: bare <think>/</think> and
// </arg_value> though the templates write newlines after them, blanks tolerated before
// </tool_call>, and </assistant> a literal stop because the model may spell it out). The replies
// as the real templates render them (Jinja2): v4/v5 with newlines, v8 without.
TEST(Reply, LagunaGlmCallsInAssistantTurns) {
  const auto S = ToolSyntax::Glm;
  const Want calls = {
      "I'm\nthinking",
      "Let me see.",
      {{"special_function", R"({"arg1": 1})"}, {"get_time", R"({"city": "Paris"})"}}};
  for (const std::string t : {"poolside-Laguna-XS-2.1.jinja", "poolside-Laguna-XS.2.jinja"}) {
    expect_reply(t, S,
                 "<think>\nI'm\nthinking\n</think>\nLet me see.\n<tool_call>special_function\n"
                 "<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>\n<tool_call>"
                 "get_time\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n"
                 "</assistant>\n",
                 calls);
    // Thinking off (the templates' default): the prompt closed the block.
    expect_reply(t, S, "Hello, world!\nWhat's up?\n</assistant>\n",
                 {"", "Hello, world!\nWhat's up?"});
  }
  const std::string v8 = "poolside-Laguna-S-2.1.jinja";  // thinking on: the prompt opens it
  expect_reply(v8, S,
               "I'm\nthinking</think>Let me see.<tool_call>special_function<arg_key>arg1</arg_key>"
               "<arg_value>1</arg_value></tool_call><tool_call>get_time<arg_key>city</arg_key>"
               "<arg_value>Paris</arg_value></tool_call></assistant>\n",
               calls, true);
  // Blanks before </tool_call>; the turn's end spelled out, and what a model writes after it
  // (the next turn) no part of the reply.
  expect_reply(v8, S,
               "</think><tool_call>get_time<arg_key>city</arg_key><arg_value>Rome</arg_value>\n\n"
               "</tool_call></assistant>\n<user>And?</user>\n<assistant>",
               {"", "", {{"get_time", R"({"city": "Rome"})"}}}, true);
  expect_reply(v8, S, "</think>Hello, world!</assistant><user>Hi</user>", {"", "Hello, world!"},
               true);

  const ReplyFormat f = format_of(v8);
  EXPECT_EQ(f.family, "laguna");
  EXPECT_EQ(f.reply_end, "</assistant>");
  EXPECT_TRUE(prompt_opens_reasoning(f, "<user>Hi</user>\n<assistant><think>"));
  EXPECT_FALSE(prompt_opens_reasoning(format_of("poolside-Laguna-XS.2.jinja"),
                                      "<user>\nHi\n</user>\n<assistant>\n</think>"));
  EXPECT_EQ(format_of("GLM-4.6.jinja").reply_end, "");
}

// Ling 3.0 (Bailing V3): GLM's calls in <role>ASSISTANT</role>..<|role_end|> turns; the prompt
// opens the reasoning block (thinking on), and a call may begin before it is closed. llama.cpp's
// test-chat.cpp vectors ("Ling 3.0 / Bailing V3 dedicated parser"), reasoning and answers trimmed
// as everywhere here.
TEST(Reply, Ling3CallsMayEndTheReasoning) {
  const std::string t = "inclusionai-ling-3.0-flash.jinja";
  const auto S = ToolSyntax::Glm;
  const ordered_json tools = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
     "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "magic_int", "parameters": {"type": "object",
     "properties": {"ref": {"type": "integer"}, "name": {"type": "string"}}, "required": ["ref"]}}},
    {"type": "function", "function": {"name": "tool_2req_4opt", "parameters": {"type": "object",
     "properties": {"req1": {"type": "string"}, "req2": {"type": "integer"},
     "opt1": {"type": "string"}, "opt2": {"type": "integer"}, "opt3": {"type": "string"},
     "opt4": {"type": "integer"}}, "required": ["req1", "req2"]}}}])");
  auto expect = [&](const std::string& text, const Want& want, bool thinking = true) {
    expect_reply(t, S, text, want, thinking, tools);
  };
  const std::string get_time =
      "<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>";
  const std::pair<std::string, std::string> paris = {"get_time", R"({"city": "Paris"})"};
  expect("I need to check the time first.\n" + get_time,
         {"I need to check the time first.", "", {paris}});
  expect("Let me check the time.\n</think>\nChecking it now.\n" + get_time,
         {"Let me check the time.", "Checking it now.", {paris}});
  expect(get_time + "\nThe time has been checked.", {"", "The time has been checked.", {paris}});
  expect("</think>\n" + get_time + "\n" + get_time, {"", "", {paris, paris}});
  expect(
      "check this\n</think>\n<tool_call>tool_2req_4opt\n<arg_key>req1</arg_key>\n<arg_value>"
      "contains </think> and <tool_call> strings</arg_value>\n<arg_key>req2</arg_key>\n"
      "<arg_value>1</arg_value>\n</tool_call>",
      {"check this",
       "",
       {{"tool_2req_4opt",
         R"({"req1": "contains </think> and <tool_call> strings", "req2": 1})"}}});
  // Thinking off: the template closed the block in the prompt.
  expect("Here is the answer.\nNo think block at all.",
         {"", "Here is the answer.\nNo think block at all."}, false);
  expect(get_time, {"", "", {paris}}, false);
  // The end of turn spelled out as text.
  expect("Here is the answer.<|role_end|>", {"", "Here is the answer."}, false);
  expect(get_time + "<|role_end|>", {"", "", {paris}});
  expect(
      "</think>\n<tool_call>get_time<arg_key>city</arg_key><arg_value>Paris</arg_value>"
      "</tool_call>",
      {"", "", {paris}});
  expect(
      "</think>\n<tool_call>tool_2req_4opt\n<arg_key>req2</arg_key>\n<arg_value>7</arg_value>\n"
      "<arg_key>req1</arg_key>\n<arg_value>hello</arg_value>\n</tool_call>",
      {"", "", {{"tool_2req_4opt", R"({"req2": 7, "req1": "hello"})"}}});
  expect(
      "</think>\n<tool_call>tool_2req_4opt\n<arg_key>req1</arg_key>\n<arg_value>hello"
      "</arg_value>\n<arg_key>req2</arg_key>\n<arg_value>7</arg_value>\n<arg_key>opt1</arg_key>\n"
      "<arg_value>extra</arg_value>\n</tool_call>",
      {"", "", {{"tool_2req_4opt", R"({"req1": "hello", "req2": 7, "opt1": "extra"})"}}});
  expect(
      "</think>\n<tool_call>magic_int\n<arg_key>ref</arg_key>\n<arg_value>42</arg_value>\n"
      "</tool_call>",
      {"", "", {{"magic_int", R"({"ref": 42})"}}});

  const ReplyFormat f = format_of(t);
  EXPECT_EQ(f.family, "ling3");
  EXPECT_EQ(f.reply_end, "<|role_end|>");
  EXPECT_TRUE(prompt_opens_reasoning(f, "<role>ASSISTANT</role>\n<think>"));
  EXPECT_FALSE(prompt_opens_reasoning(f, "<role>ASSISTANT</role>\n<think></think>"));
  // Where no calls were offered, <tool_call> in the reasoning is reasoning.
  ParseOptions o;
  o.starts_in_reasoning = true, o.calls = false;
  EXPECT_EQ(parse_reply(f, "a <tool_call>b\n</tool_call></think>c", o).reasoning,
            "a <tool_call>b\n</tool_call>");
}

// Step 3.5 Flash (StepFun3.5-Flash.jinja) writes Qwen3-Coder's calls; llama.cpp's test-chat.cpp
// vectors for it, values typed by the tools' schemas (a string stays a string whatever it reads
// as).
TEST(Reply, StepFun35QwenXmlCalls) {
  const std::string t = "StepFun3.5-Flash.jinja";
  const auto S = ToolSyntax::Qwen3Coder;
  const ordered_json tools = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "magic", "parameters": {"type": "object",
     "properties": {"name": {"type": "string"}, "ref": {"type": "string"}},
     "required": ["name", "ref"]}}},
    {"type": "function", "function": {"name": "special_function", "parameters": {"type": "object",
     "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]}}},
    {"type": "function", "function": {"name": "string_param", "parameters": {"type": "object",
     "properties": {"text": {"type": "string"}}, "required": []}}}])");
  auto expect = [&](const std::string& text, const Want& want) {
    expect_reply(t, S, text, want, true, tools);
  };
  expect("I was thinking\n</think>\nNow I'm not.", {"I was thinking", "Now I'm not."});
  expect(
      "Let me call the magic tool\n</think>\n<tool_call>\n<function=magic>\n<parameter=name>\n"
      "fooBar\n</parameter>\n<parameter=ref>\n5123123\n</parameter>\n</function>\n</tool_call>",
      {"Let me call the magic tool", "", {{"magic", R"({"name": "fooBar", "ref": "5123123"})"}}});
  expect(
      "Let me call the special function\n</think>\n<tool_call>\n<function=special_function>\n"
      "<parameter=arg1>\n42555916\n</parameter>\n</function>\n</tool_call>",
      {"Let me call the special function", "", {{"special_function", R"({"arg1": 42555916})"}}});
  expect(
      "Call string_param with empty text\n</think>\n<tool_call>\n<function=string_param>\n"
      "<parameter=text>\n\n</parameter>\n</function>\n</tool_call>",
      {"Call string_param with empty text", "", {{"string_param", R"({"text": ""})"}}});
  EXPECT_TRUE(prompt_opens_reasoning(format_of(t), "<|im_start|>assistant\n<think>\n"));
}

// MiniMax-M3: llama.cpp's test-chat.cpp vectors ("MiniMax-M3 tests - namespaced XML invoke
// format"), with its tools. Every marker carries the namespace token; an argument is an element
// named by its key, objects and arrays nested elements, and the tool's schema says how a value is
// read (a string as written, whatever it looks like; else JSON; a union's first alternative that
// reads).
namespace {

const ordered_json kM3Tools = ordered_json::parse(R"([
  {"type": "function", "function": {"name": "special_function", "parameters": {"type": "object",
   "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
   "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
   "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "empty_args", "parameters": {"type": "object",
   "properties": {}}}},
  {"type": "function", "function": {"name": "magic_int", "parameters": {"type": "object",
   "properties": {"ref": {"type": "integer"}, "name": {"type": "string"}}, "required": ["ref"]}}},
  {"type": "function", "function": {"name": "amount", "parameters": {"type": "object",
   "properties": {"orig": {"type": "number"}}, "required": ["orig"]}}},
  {"type": "function", "function": {"name": "toggle", "parameters": {"type": "object",
   "properties": {"enabled": {"type": "boolean"}}, "required": ["enabled"]}}},
  {"type": "function", "function": {"name": "imaginary_number", "parameters": {"type": "object",
   "properties": {"number": {"type": "object", "properties": {"real": {"type": "number"},
   "imaginary": {"type": "number"}}, "required": ["real", "imaginary"]}},
   "required": ["number"]}}},
  {"type": "function", "function": {"name": "nested_args", "parameters": {"type": "object",
   "properties": {"tags": {"type": "array", "items": {"type": "string"}},
   "entries": {"type": "array", "items": {"type": "object", "properties": {
   "id": {"type": "integer"}, "label": {"type": "string"}}, "required": ["id", "label"]}}},
   "required": ["tags", "entries"]}}},
  {"type": "function", "function": {"name": "union_args", "parameters": {"type": "object",
   "properties": {
   "filter": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "object",
     "properties": {"field": {"type": "string"}, "op": {"type": "string"}},
     "required": ["field", "op"]}]},
   "label": {"oneOf": [{"type": "string"}, {"type": "object",
     "properties": {"text": {"type": "string"}}}]},
   "limit": {"oneOf": [{"type": "integer"}, {"type": "object",
     "properties": {"max": {"type": "integer"}}, "required": ["max"]}]}}}}}])");

// One call in M3's block: the invoke of `name` around `body`.
std::string m3_call(const std::string& name, const std::string& body) {
  const std::string ns = "]<]minimax[>[";
  return ns + "<tool_call>\n" + ns + "<invoke name=\"" + name + "\">" + body + ns + "</invoke>\n" +
         ns + "</tool_call>";
}
std::string m3_arg(const std::string& key, const std::string& value) {
  return "]<]minimax[>[<" + key + ">" + value + "]<]minimax[>[</" + key + ">";
}

}  // namespace

TEST(Reply, MiniMaxM3NamespacedCalls) {
  const std::string t = "MiniMax-M3.jinja";
  const auto S = ToolSyntax::MiniMaxM3;
  auto expect = [&](const std::string& text, const Want& want) {
    expect_reply(t, S, text, want, false, kM3Tools);
  };
  // A turn without reasoning begins with a bare </mm:think>.
  expect("</mm:think>Hello, world!\nWhat's up?", {"", "Hello, world!\nWhat's up?"});
  expect("<mm:think>I'm\nthinking</mm:think>Hello, world!\nWhat's up?",
         {"I'm\nthinking", "Hello, world!\nWhat's up?"});
  expect(
      "<mm:think>Let me check the time</mm:think>" + m3_call("get_time", m3_arg("city", "Tokyo")),
      {"Let me check the time", "", {{"get_time", R"({"city": "Tokyo"})"}}});
  expect("</mm:think>" + m3_call("special_function", m3_arg("arg1", "1")),
         {"", "", {{"special_function", R"({"arg1": 1})"}}});
  expect("<mm:think>Let's call a tool:</mm:think>" + m3_call("empty_args", ""),
         {"Let's call a tool:", "", {{"empty_args", "{}"}}});
  const std::string ns = "]<]minimax[>[";
  expect("<mm:think>Calling both</mm:think>" + ns + "<tool_call>\n" + ns +
             "<invoke name=\"get_time\">" + m3_arg("city", "Paris") + ns + "</invoke>\n" + ns +
             "<invoke name=\"get_weather\">" + m3_arg("city", "Paris") + ns + "</invoke>\n" + ns +
             "</tool_call>",
         {"Calling both",
          "",
          {{"get_time", R"({"city": "Paris"})"}, {"get_weather", R"({"city": "Paris"})"}}});
  expect(
      "<mm:think>Thinking about it</mm:think>Let me call the function." +
          m3_call("special_function", m3_arg("arg1", "1")),
      {"Thinking about it", "Let me call the function.", {{"special_function", R"({"arg1": 1})"}}});
  expect("<mm:think>Test negative</mm:think>" + m3_call("magic_int", m3_arg("ref", "-14")),
         {"Test negative", "", {{"magic_int", R"({"ref": -14})"}}});
  expect("<mm:think>Test decimal</mm:think>" + m3_call("amount", m3_arg("orig", "3.14")),
         {"Test decimal", "", {{"amount", R"({"orig": 3.14})"}}});
  expect("<mm:think>Test boolean</mm:think>" + m3_call("toggle", m3_arg("enabled", "true")),
         {"Test boolean", "", {{"toggle", R"({"enabled": true})"}}});
  expect("<mm:think>Multi-arg call</mm:think>" +
             m3_call("magic_int", m3_arg("ref", "42") + m3_arg("name", "foo bar")),
         {"Multi-arg call", "", {{"magic_int", R"({"ref": 42, "name": "foo bar"})"}}});
  expect("<mm:think>Nested object</mm:think>" +
             m3_call("imaginary_number",
                     m3_arg("number", m3_arg("real", "1.5") + m3_arg("imaginary", "-2.5"))),
         {"Nested object",
          "",
          {{"imaginary_number", R"({"number": {"real": 1.5, "imaginary": -2.5}})"}}});
  expect("<mm:think>Nested arrays</mm:think>" +
             m3_call(
                 "nested_args",
                 m3_arg("tags", m3_arg("item", "alpha") + m3_arg("item", "beta")) +
                     m3_arg("entries", m3_arg("item", m3_arg("id", "1") + m3_arg("label", "one")))),
         {"Nested arrays",
          "",
          {{"nested_args",
            R"({"tags": ["alpha", "beta"], "entries": [{"id": 1, "label": "one"}]})"}}});
  expect(
      "<mm:think>Union array</mm:think>" +
          m3_call("union_args", m3_arg("filter", m3_arg("item", "alpha") + m3_arg("item", "beta"))),
      {"Union array", "", {{"union_args", R"({"filter": ["alpha", "beta"]})"}}});
  expect("<mm:think>Union scalar</mm:think>" + m3_call("union_args", m3_arg("limit", "5")),
         {"Union scalar", "", {{"union_args", R"({"limit": 5})"}}});
  expect("<mm:think>Union nested</mm:think>" +
             m3_call("union_args", m3_arg("limit", m3_arg("max", "10"))),
         {"Union nested", "", {{"union_args", R"({"limit": {"max": 10}})"}}});
  // A union with a string alternative is a string, even when the value looks structured.
  expect("<mm:think>Union string</mm:think>" + m3_call("union_args", m3_arg("label", "hi")),
         {"Union string", "", {{"union_args", R"({"label": "hi"})"}}});
  expect("<mm:think>Union string</mm:think>" +
             m3_call("union_args", m3_arg("label", m3_arg("text", "hi"))),
         {"Union string",
          "",
          {{"union_args", R"({"label": "]<]minimax[>[<text>hi]<]minimax[>[</text>"})"}}});
  expect("<mm:think></mm:think>" + m3_call("get_time", m3_arg("city", "XYZCITY")),
         {"", "", {{"get_time", R"({"city": "XYZCITY"})"}}});
  // llama.cpp's continuation of prefilled reasoning, as a prompt that opened the block (the
  // template's thinking_mode "enabled") leaves it.
  expect_reply(t, S, "I'm thinking</mm:think>Hello, world!\nWhat's up?",
               {"I'm thinking", "Hello, world!\nWhat's up?"}, true, kM3Tools);
}

// M3 beyond llama.cpp's vectors: the template's own rendering read back, the blanks xgrammar's
// minimax_m3_xml lets between elements, and tools without a schema (or a value the schema does
// not allow) read as the template writes values.
TEST(Reply, MiniMaxM3TemplateShapes) {
  const std::string t = "MiniMax-M3.jinja";
  const auto S = ToolSyntax::MiniMaxM3;
  const std::string ns = "]<]minimax[>[";
  // expected.json's "tools" conversation: the assistant's call as the template renders it.
  expect_reply(t, S,
               "</mm:think>" + ns + "<tool_call>\n" + ns + "<invoke name=\"get_weather\">" + ns +
                   "<location>Paris" + ns + "</location>" + ns + "<unit>celsius" + ns + "</unit>" +
                   ns + "</invoke>\n" + ns + "</tool_call>",
               {"", "", {{"get_weather", R"({"location": "Paris", "unit": "celsius"})"}}});
  expect_reply(t, S, "</mm:think>" + m3_call("get_time", "\n " + m3_arg("city", "Rome") + "\n\n"),
               {"", "", {{"get_time", R"({"city": "Rome"})"}}}, false, kM3Tools);
  // The template's example (its system prompt) for a tool it knows no schema of.
  expect_reply(
      t, S,
      "</mm:think>" + m3_call("tool-name-1",
                              m3_arg("param-1", "value-1") +
                                  m3_arg("param-2", m3_arg("item", m3_arg("key-a", "val-a") +
                                                                       m3_arg("key-b", "val-b")))),
      {"",
       "",
       {{"tool-name-1",
         R"({"param-1": "value-1", "param-2": [{"key-a": "val-a", "key-b": "val-b"}]})"}}},
      false, kM3Tools);
  expect_reply(t, S,
               "</mm:think>" + m3_call("unknown", m3_arg("n", "7") + m3_arg("item", "x") +
                                                      m3_arg("flags", m3_arg("item", "true"))),
               {"", "", {{"unknown", R"({"n": 7, "item": "x", "flags": [true]})"}}}, false,
               kM3Tools);
  // A union with a string alternative anywhere in it is a string (llama.cpp: may_be_string).
  const ordered_json either = ordered_json::parse(R"([{"type": "function", "function": {
    "name": "note", "parameters": {"type": "object", "properties": {"body": {"anyOf": [
    {"type": "object", "properties": {"text": {"type": "string"}}}, {"type": "string"}]}}}}}])");
  expect_reply(t, S, "</mm:think>" + m3_call("note", m3_arg("body", m3_arg("text", "hi"))),
               {"", "", {{"note", R"({"body": "]<]minimax[>[<text>hi]<]minimax[>[</text>"})"}}},
               false, either);
  // A value the schema does not allow is kept (as a string) rather than losing the call.
  expect_reply(t, S, "</mm:think>" + m3_call("special_function", m3_arg("arg1", "one")),
               {"", "", {{"special_function", R"({"arg1": "one"})"}}}, false, kM3Tools);
  // Text that merely looks like the block stays the answer.
  expect_reply(t, S, "</mm:think>Look: " + ns + "<tool_call>\nnot a call",
               {"", "Look: " + ns + "<tool_call>\nnot a call"}, false, kM3Tools);

  const ReplyFormat f = format_of(t);
  EXPECT_EQ(f.family, "minimax-m3");
  EXPECT_EQ(f.think_open, "<mm:think>");
  EXPECT_EQ(f.think_close, "</mm:think>");
  EXPECT_TRUE(prompt_opens_reasoning(f, "]~b]ai\n<mm:think>"));
  EXPECT_FALSE(prompt_opens_reasoning(f, "]~b]ai\n"));
  // The forcing grammar's call: xgrammar's minimax_m3_xml arguments between the template's
  // markers (the schema goes whole to xgrammar, which writes objects and arrays as elements).
  const CallShape s = call_shape(f, "get_time");
  EXPECT_EQ(s.begin, ns + "<tool_call>\n" + ns + "<invoke name=\"get_time\">");
  EXPECT_EQ(s.style, "minimax_m3_xml");
  EXPECT_EQ(s.end, ns + "</invoke>\n" + ns + "</tool_call>");
}

TEST(Reply, FamiliesAreToldApartByTheirTemplates) {
  EXPECT_EQ(format_of("Qwen3.5-4B.jinja").tools, ToolSyntax::Qwen3Coder);
  EXPECT_EQ(format_of("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja").tools,
            ToolSyntax::Hermes);
  EXPECT_EQ(format_of("moonshotai-Kimi-K2.jinja").tools, ToolSyntax::KimiK2);
  EXPECT_EQ(format_of("deepseek-ai-DeepSeek-V3.2.jinja").tools, ToolSyntax::DeepSeekDsml);
  EXPECT_EQ(format_of("deepseek-ai-DeepSeek-V3.2.jinja").dsml_block, "function_calls");
  EXPECT_EQ(format_of("deepseek-ai-DeepSeek-V4.jinja").dsml_block, "tool_calls");
  EXPECT_EQ(format_of("google-gemma-2-2b-it.jinja").tools, ToolSyntax::None);
  EXPECT_EQ(format_of("MiniMax-M2.jinja").tools, ToolSyntax::MiniMax);
  EXPECT_EQ(format_of("MiniMax-M3.jinja").tools, ToolSyntax::MiniMaxM3);
  EXPECT_EQ(format_of("tencent-Hy3.jinja").tools, ToolSyntax::Hy3);
  const ReplyFormat q = format_of("Qwen-Qwen3-0.6B.jinja");
  EXPECT_TRUE(prompt_opens_reasoning(q, "<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning(q, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}
