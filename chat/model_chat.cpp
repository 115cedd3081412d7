#include "chat/model_chat.h"

#include <fstream>
#include <iterator>

namespace expertd::chat {

Result<ModelChat> ModelChat::load(const gguf::Model& f, const engine::Tokenizer& tok,
                                  const std::string& template_file) {
  ModelChat c;
  std::string src;
  if (!template_file.empty()) {
    std::ifstream in(template_file, std::ios::binary);
    if (!in) return errno_error("cannot read the chat template " + template_file);
    src.assign(std::istreambuf_iterator<char>(in), {});
  } else if (auto t = f.get_string("tokenizer.chat_template")) {
    src = std::string(*t);
  }
  if (!src.empty()) {
    auto t = ChatTemplate::parse(src);
    if (!t) return t.error();
    c.tmpl = std::move(*t);
    c.reply = detect_reply_format(src);
  }
  if (tok.bos() >= 0) c.bos = tok.piece(tok.bos(), true);
  if (tok.eos() >= 0) c.eos = tok.piece(tok.eos(), true);
  return c;
}

Result<std::string> ModelChat::render(const nlohmann::ordered_json& messages, ChatOptions o) const {
  if (!tmpl) return make_error("the model has no chat template");
  o.bos_token = bos, o.eos_token = eos;
  return tmpl->render(messages, o);
}

bool ModelChat::needs_bos(const engine::Tokenizer& tok, const std::string& text) const {
  return tok.add_bos() && !(!bos.empty() && text.rfind(bos, 0) == 0);
}

}  // namespace expertd::chat
