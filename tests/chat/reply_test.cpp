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
                  const Want& want, bool in_reasoning = false) {
  SCOPED_TRACE(tmpl + ": " + text);
  const ReplyFormat f = format_of(tmpl);
  ASSERT_EQ(syntax_name(f.tools), std::string(syntax_name(syntax)));
  ParseOptions o;
  o.starts_in_reasoning = in_reasoning;
  o.tools = kTools;
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

TEST(Reply, FamiliesAreToldApartByTheirTemplates) {
  EXPECT_EQ(format_of("Qwen3.5-4B.jinja").tools, ToolSyntax::Qwen3Coder);
  EXPECT_EQ(format_of("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja").tools,
            ToolSyntax::Hermes);
  EXPECT_EQ(format_of("moonshotai-Kimi-K2.jinja").tools, ToolSyntax::KimiK2);
  EXPECT_EQ(format_of("deepseek-ai-DeepSeek-V3.2.jinja").tools, ToolSyntax::DeepSeekDsml);
  EXPECT_EQ(format_of("deepseek-ai-DeepSeek-V3.2.jinja").dsml_block, "function_calls");
  EXPECT_EQ(format_of("deepseek-ai-DeepSeek-V4.jinja").dsml_block, "tool_calls");
  EXPECT_EQ(format_of("google-gemma-2-2b-it.jinja").tools, ToolSyntax::None);
  const ReplyFormat q = format_of("Qwen-Qwen3-0.6B.jinja");
  EXPECT_TRUE(prompt_opens_reasoning(q, "<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning(q, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}
