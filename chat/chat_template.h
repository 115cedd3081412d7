// A model's chat template (the GGUF's tokenizer.chat_template) applied to a conversation, as
// Hugging Face's apply_chat_template does: the template sees `messages`, `tools` (when given),
// `add_generation_prompt`, `bos_token`, `eos_token` and any extra variables (enable_thinking,
// reasoning_effort, ...), and may call raise_exception and strftime_now.
#pragma once

#include <ctime>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/jinja.h"
#include "common/result.h"

namespace expertd::chat {

struct ChatOptions {
  bool add_generation_prompt = true;
  nlohmann::ordered_json tools;  // null: none
  std::string bos_token, eos_token;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more template variables
  std::time_t now = 0;  // strftime_now's clock (0: the real one)
};

class ChatTemplate {
 public:
  // An error names what in the template could not be parsed.
  static Result<ChatTemplate> parse(const std::string& source);
  // The conversation rendered: `messages` is an array of {role, content, ...} objects as the
  // OpenAI and Anthropic APIs carry them (content a string, or null beside tool_calls).
  Result<std::string> render(const nlohmann::ordered_json& messages, const ChatOptions& o) const;

 private:
  jinja::Template t_;
};

}  // namespace expertd::chat
