// A model's chat, as expert-run --chat and expert-serve use it: the template (a file given on
// the command line, else the GGUF's tokenizer.chat_template, else none), the tokenizer's BOS and
// EOS texts the template sees, and the rule that a rendered text already starting with the BOS
// text gets no second BOS.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "chat/chat_template.h"
#include "chat/reply.h"
#include "common/result.h"
#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"

namespace expertd::chat {

struct ModelChat {
  std::optional<ChatTemplate> tmpl;  // none: the model has no template and none was given
  std::string bos, eos;
  ReplyFormat reply;  // how the model writes reasoning and tool calls (from the template)

  // An error names the unreadable file or what in the template could not be parsed.
  static Result<ModelChat> load(const gguf::Model& f, const engine::Tokenizer& tok,
                                const std::string& template_file);
  // The conversation rendered with the BOS/EOS texts filled in (the template must exist).
  Result<std::string> render(const nlohmann::ordered_json& messages, ChatOptions o) const;
  // Whether encoding `text` should add the BOS token.
  bool needs_bos(const engine::Tokenizer& tok, const std::string& text) const;
};

}  // namespace expertd::chat
