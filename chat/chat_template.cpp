#include "chat/chat_template.h"

namespace expertd::chat {

Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  auto t = jinja::Template::parse(source);
  if (!t) return make_error("chat template: " + t.error().message);
  ChatTemplate c;
  c.t_ = std::move(*t);
  return c;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         const ChatOptions& o) const {
  if (!messages.is_array()) return make_error("messages must be an array");
  jinja::Value ctx = jinja::Value::object();
  for (const auto& [k, v] : o.extra.items()) ctx.obj().set(k, jinja::Value::from_json(v));
  ctx.obj().set("messages", jinja::Value::from_json(messages));
  if (!o.tools.is_null()) ctx.obj().set("tools", jinja::Value::from_json(o.tools));
  ctx.obj().set("add_generation_prompt", jinja::Value(o.add_generation_prompt));
  ctx.obj().set("bos_token", jinja::Value(o.bos_token));
  ctx.obj().set("eos_token", jinja::Value(o.eos_token));
  auto r = t_.render(ctx, {o.now});
  if (!r) return make_error("chat template: " + r.error().message);
  return r;
}

}  // namespace expertd::chat
