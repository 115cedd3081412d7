// The agent side of a chat request, common to the OpenAI and Anthropic APIs: tool definitions
// checked, the tool choice and response format turned into a grammar for constrained decoding,
// and the reply tracked as it is generated so each stream event carries only what is new.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/reply.h"
#include "serve/grammar.h"

namespace expertd::serve {

struct HttpError {
  int status;
  std::string type, message;
};
inline HttpError bad_request(const std::string& why) {
  return {400, "invalid_request_error", why};
}

// OpenAI-shaped tools ({type: function, function: {name, description, parameters}}), checked;
// `field` names the request field in errors.
nlohmann::ordered_json check_tools(const nlohmann::ordered_json& tools, const std::string& field);
// Anthropic's ({name, description, input_schema}) in OpenAI's shape, checked.
nlohmann::ordered_json anthropic_tools(const nlohmann::ordered_json& tools);

// A JSON schema uses only keywords the grammar compiler enforces; else a 400 naming the
// keyword and where it is.
void check_schema(const nlohmann::ordered_json& schema, const std::string& where);

struct ToolChoice {
  enum class Mode { Auto, None, Required, Named } mode = Mode::Auto;
  std::string name;
};
// tool_choice of either API, checked against the tools (a named tool must be one of them).
ToolChoice openai_tool_choice(const nlohmann::ordered_json& choice,
                              const nlohmann::ordered_json& tools);
ToolChoice anthropic_tool_choice(const nlohmann::ordered_json& choice,
                                 const nlohmann::ordered_json& tools);

// What a constrained reply must write first: the reasoning block closed (empty) when the prompt
// opened it (MiniMax-M3: the close also where it did not, as its turns without reasoning begin),
// and the answer section closed where the family wraps answers (Kimi-K3).
std::string reply_prefix(const chat::ReplyFormat& f, bool in_reasoning);
// One call of a listed tool (Required) or of the named one, arguments valid against its schema.
GrammarSpec call_grammar(const chat::ReplyFormat& f, const nlohmann::ordered_json& tools,
                         const ToolChoice& c, const std::string& prefix);
// JSON valid against `schema` (null: any JSON object), after `prefix`.
GrammarSpec json_grammar(const nlohmann::ordered_json* schema, const std::string& prefix);

// What is new in a reply since the last update.
struct ReplyDelta {
  std::string reasoning, content;
  struct Call {
    int index;
    bool start;  // the call's first event: its name (then its arguments, once complete)
    std::string name, arguments;
  };
  std::vector<Call> calls;
};

class ReplyTracker {
 public:
  // f null: the text is all answer (no template, or a plain completion).
  ReplyTracker(const chat::ReplyFormat* f, chat::ParseOptions o) : f_(f), o_(std::move(o)) {}
  // `text`: everything generated so far; `final`: nothing more will come.
  ReplyDelta update(std::string_view text, bool final);
  const chat::Reply& reply() const { return last_; }

 private:
  const chat::ReplyFormat* f_;
  chat::ParseOptions o_;
  chat::Reply last_;
  size_t sent_reasoning_ = 0, sent_content_ = 0;
  int started_ = 0, argued_ = 0;
};

}  // namespace expertd::serve
