// What a model writes back, taken apart: its reasoning, its answer and its tool calls, in the
// syntax of its family (as llama.cpp's common/chat.cpp tells the families apart: by markers in
// the chat template's source). The same parser reads a finished reply and a reply still being
// generated (`partial`): a partial parse never shows text that might yet turn out to be a marker,
// so what it shows is always a prefix of what the finished parse will show, and a stream of
// differences assembles to exactly the finished result.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace expertd::chat {

enum class ToolSyntax {
  None,        // the template knows no tool calls
  Hermes,      // Qwen3, Qwen2.5, Hermes: <tool_call>{"name": .., "arguments": ..}</tool_call>
  Qwen3Coder,  // <tool_call><function=N><parameter=K>V</parameter></function></tool_call>
  Glm,         // GLM-4.5/4.6/4.7: <tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>
  KimiK2,  // <|tool_calls_section_begin|><|tool_call_begin|>functions.N:i<|tool_call_argument_begin|>
  KimiK3,      // XTML: <|open|>tools<|sep|><|open|>call tool="N"<|sep|><|open|>argument key=..
  DeepSeekV3,  // V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{..}
  DeepSeekDsml,  // V3.2 / V4: <｜DSML｜tool_calls><｜DSML｜invoke name="N"><｜DSML｜parameter ..
  MiniMax,    // MiniMax-M2: <minimax:tool_call><invoke name="N"><parameter name="K">V</parameter>
  MiniMaxM3,  // each marker after ]<]minimax[>[: <tool_call><invoke name="N"><K>V</K></invoke>
  Hy3,  // <tool_calls:S><tool_call:S>N<tool_sep:S><arg_key:S>K</arg_key:S><arg_value:S>V</arg_value:S>
  Harmony,  // gpt-oss: <|channel|>analysis|final|commentary to=functions.N<|message|>
};

struct ReplyFormat {
  ToolSyntax tools = ToolSyntax::None;
  std::string family;  // for messages: "qwen3", "kimi-k2", ...
  // The reasoning block's markers (empty: the family has no reasoning block of this shape).
  std::string think_open = "<think>", think_close = "</think>";
  // MiniMax-M3 begins a turn without reasoning with think_close alone.
  bool bare_think_close = false;
  // Ling 3.0's calls may begin inside the reasoning block, which then ends there.
  bool call_ends_reasoning = false;
  // Kimi-K3 wraps the answer in these.
  std::string content_open, content_close;
  // The end of the model's turn written as text (Kimi-K3's message close; Laguna's </assistant>,
  // which its model may spell out rather than write as its end-of-turn token): the reply ends
  // there.
  std::string reply_end;
  std::string dsml_block = "tool_calls";  // DeepSeek V3.2 names it function_calls
  std::string tag_suffix;  // Hy3's markers all end in the template's HYTK (":opensource")
};

// The format of the model whose chat template this is.
ReplyFormat detect_reply_format(std::string_view template_source);
const char* syntax_name(ToolSyntax s);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object; complete: valid and final
  bool complete = false;  // false: the text ended inside the call
};

struct Reply {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  size_t bad_at = std::string_view::npos;  // (the parser's: where text that is no call began)
};

struct ParseOptions {
  bool starts_in_reasoning = false;  // the prompt ended by opening the reasoning block
  bool partial = false;              // more text may follow
  bool calls = true;                 // look for tool calls (false: none were offered)
  nlohmann::ordered_json tools;      // OpenAI tool definitions: typed values for the XML forms
};

Reply parse_reply(const ReplyFormat& f, std::string_view text, const ParseOptions& o);

// Whether a rendered prompt leaves the model inside its reasoning block.
bool prompt_opens_reasoning(const ReplyFormat& f, std::string_view prompt);

// How a call of the tool `name` is written: the text before its arguments, the xgrammar
// structural-tag style of the arguments ("json", "qwen_xml", ...) and the text after them.
// Where xgrammar has no style for a family's arguments (style empty), each is written
// key_open K key_close blank value_open V value_close blank, a string value as it is and any
// other as JSON (as the template writes them).
struct CallShape {
  std::string begin, style, end;
  std::string key_open, key_close, value_open, value_close, blank;  // blank: after each close
};
CallShape call_shape(const ReplyFormat& f, const std::string& name);

}  // namespace expertd::chat
