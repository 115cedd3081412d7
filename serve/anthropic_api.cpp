// Anthropic's Messages API: messages in (tool_use, tool_result and thinking blocks), messages
// out as content blocks, streamed as its named events.
#include "serve/server_impl.h"

namespace expertd::serve {

namespace {

const char* anthropic_stop(Finish f, const chat::Reply& r) {
  return f == Finish::Length         ? "max_tokens"
         : called(f, r)              ? "tool_use"
         : f == Finish::StopSequence ? "stop_sequence"
                                     : "end_turn";
}

}  // namespace

// Anthropic's messages as templates read them (OpenAI's shape): tool_use blocks become the
// assistant's tool_calls, tool_result blocks tool messages, thinking blocks its reasoning.
ordered_json Server::Impl::anthropic_messages(const ordered_json& b) {
  ordered_json out = ordered_json::array();
  if (b.contains("system") && !b["system"].is_null())
    out.push_back({{"role", "system"}, {"content", content_text(b["system"], "system")}});
  if (!b.contains("messages") || !b["messages"].is_array() || b["messages"].empty())
    throw bad_request("messages must be a non-empty array");
  std::map<std::string, std::string> tool_names;  // tool_use id -> name
  for (size_t i = 0; i < b["messages"].size(); ++i) {
    const auto& m = b["messages"][i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw bad_request("each message needs a string role");
    const std::string role = m["role"];
    if (role != "user" && role != "assistant") throw bad_request("role must be user or assistant");
    const ordered_json content = m.value("content", ordered_json());
    if (!content.is_array()) {
      out.push_back({{"role", role}, {"content", content_text(content, "content")}});
      continue;
    }
    std::string text, thinking;
    ordered_json calls = ordered_json::array();
    for (size_t k = 0; k < content.size(); ++k) {
      const auto& part = content[k];
      const std::string pat = at + ".content[" + std::to_string(k) + "]";
      const std::string type = part.is_object() ? part.value("type", "") : "";
      if (type == "text" && part.contains("text") && part["text"].is_string()) {
        text += part["text"].get<std::string>();
      } else if (type == "thinking" && role == "assistant") {
        thinking += part.value("thinking", "");
      } else if (type == "redacted_thinking" && role == "assistant") {
      } else if (type == "tool_use" && role == "assistant") {
        if (!part.contains("id") || !part["id"].is_string() || !part.contains("name") ||
            !part["name"].is_string())
          throw bad_request(pat + ": a tool_use block needs a string id and name");
        const ordered_json input = part.value("input", ordered_json::object());
        if (!input.is_object()) throw bad_request(pat + ".input must be an object");
        tool_names[part["id"]] = part["name"];
        calls.push_back({{"id", part["id"]},
                         {"type", "function"},
                         {"function", {{"name", part["name"]}, {"arguments", input}}}});
      } else if (type == "tool_result" && role == "user") {
        if (!part.contains("tool_use_id") || !part["tool_use_id"].is_string())
          throw bad_request(pat + ": a tool_result block needs a string tool_use_id");
        const std::string id = part["tool_use_id"];
        std::string result =
            content_text(part.value("content", ordered_json("")), (pat + ".content").c_str());
        if (part.value("is_error", false)) result = "Error: " + result;
        ordered_json tm{{"role", "tool"}, {"tool_call_id", id}, {"content", result}};
        if (tool_names.count(id)) tm["name"] = tool_names[id];
        out.push_back(std::move(tm));
      } else {
        throw bad_request(pat +
                          ": only text, tool_use, tool_result and thinking blocks are "
                          "supported");
      }
    }
    if (role == "user" && text.empty() && !out.empty() && out.back()["role"] == "tool") continue;
    ordered_json n{{"role", role}, {"content", text}};
    if (!calls.empty()) n["tool_calls"] = calls;
    if (!thinking.empty()) n["reasoning_content"] = thinking;
    out.push_back(std::move(n));
  }
  return out;
}

// A call's input as Anthropic carries it: an object (an unfinished call's is empty; the
// stop_reason max_tokens says it was cut).
json Server::Impl::call_input(const chat::ToolCall& call) {
  if (!call.complete) return json::object();
  json j = json::parse(call.arguments, nullptr, false);
  return j.is_object() ? j : json::object();
}

// Anthropic counts the prompt tokens read from the cache apart from input_tokens.
json Server::Impl::anthropic_usage(int n_prompt, const Request::Update& u) {
  return {{"input_tokens", n_prompt - u.cached_tokens},
          {"output_tokens", u.completion_tokens},
          {"cache_read_input_tokens", u.cached_tokens},
          {"cache_creation_input_tokens", 0}};
}

int Server::Impl::anthropic(const std::shared_ptr<Request>& r, Plan& plan, Conn& c, bool stream,
                            int n_prompt) {
  const std::string id = random_id("msg_");
  ReplyTracker tracker(plan.format, plan.parse);
  auto stop_seq = [](const Request::Update& u) {
    return u.finish == Finish::StopSequence ? json(u.stop_sequence) : json(nullptr);
  };
  if (!stream) {
    Outcome out = drive(r, c, nullptr);
    if (out.gone) return 499;
    if (out.last.finish == Finish::Error) {
      c.send_json(503, error_body(Api::Anthropic, {503, "api_error", out.last.error}));
      return 503;
    }
    tracker.update(out.text, true);
    const chat::Reply& rep = tracker.reply();
    json content = json::array();
    if (!rep.reasoning.empty())
      content.push_back({{"type", "thinking"}, {"thinking", rep.reasoning}, {"signature", ""}});
    if (!rep.content.empty() || rep.calls.empty())
      content.push_back({{"type", "text"}, {"text", rep.content}});
    for (size_t i = 0; i < rep.calls.size(); ++i)
      content.push_back({{"type", "tool_use"},
                         {"id", plan.call_id(i, Api::Anthropic)},
                         {"name", rep.calls[i].name},
                         {"input", call_input(rep.calls[i])}});
    json j{{"id", id},
           {"type", "message"},
           {"role", "assistant"},
           {"model", o.model_id},
           {"content", content},
           {"stop_reason", anthropic_stop(out.last.finish, rep)},
           {"stop_sequence", stop_seq(out.last)},
           {"usage", anthropic_usage(n_prompt, out.last)}};
    c.send_json(200, dump(j));
    return 200;
  }
  if (!c.start_stream()) {
    r->cancel();
    return 499;
  }
  json start{{"type", "message_start"},
             {"message",
              {{"id", id},
               {"type", "message"},
               {"role", "assistant"},
               {"model", o.model_id},
               {"content", json::array()},
               {"stop_reason", nullptr},
               {"stop_sequence", nullptr},
               {"usage", {{"input_tokens", n_prompt}, {"output_tokens", 0}}}}}};
  if (!c.chunk(event("message_start", start))) {
    r->cancel();
    return 499;
  }
  // Blocks open as their kind of text appears; one is open at a time.
  int index = -1;
  std::string open_kind;
  auto open = [&](const std::string& kind, json block) {
    bool ok = true;
    if (!open_kind.empty())
      ok = c.chunk(event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}}));
    open_kind = kind;
    ++index;
    return ok && c.chunk(event("content_block_start", {{"type", "content_block_start"},
                                                       {"index", index},
                                                       {"content_block", std::move(block)}}));
  };
  auto delta = [&](json d) {
    return c.chunk(
        event("content_block_delta",
              {{"type", "content_block_delta"}, {"index", index}, {"delta", std::move(d)}}));
  };
  auto send = [&](const ReplyDelta& d) {
    bool ok = true;
    if (!d.reasoning.empty()) {
      if (open_kind != "thinking")
        ok = ok && open("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      ok = ok && delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
    }
    if (!d.content.empty()) {
      if (open_kind != "text") ok = ok && open("text", {{"type", "text"}, {"text", ""}});
      ok = ok && delta({{"type", "text_delta"}, {"text", d.content}});
    }
    for (const auto& call : d.calls) {
      if (call.start) {
        ok = ok && open("tool_use" + std::to_string(call.index),
                        {{"type", "tool_use"},
                         {"id", plan.call_id(size_t(call.index), Api::Anthropic)},
                         {"name", call.name},
                         {"input", json::object()}});
      } else {
        const auto& tc = tracker.reply().calls[size_t(call.index)];
        ok = ok && delta({{"type", "input_json_delta"}, {"partial_json", dump(call_input(tc))}});
      }
    }
    return ok;
  };
  std::string text;
  Outcome out = drive(r, c, [&](const std::string& t) {
    text += t;
    return send(tracker.update(text, false));
  });
  if (out.gone) return 499;
  if (out.last.finish == Finish::Error) {
    c.chunk(event("error", {{"type", "error"},
                            {"error", {{"type", "api_error"}, {"message", out.last.error}}}}));
    c.end_stream();
    c.keep_alive = false;
    return 200;
  }
  send(tracker.update(text, true));
  if (open_kind.empty()) open("text", {{"type", "text"}, {"text", ""}});
  c.chunk(event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}}));
  c.chunk(
      event("message_delta", {{"type", "message_delta"},
                              {"delta",
                               {{"stop_reason", anthropic_stop(out.last.finish, tracker.reply())},
                                {"stop_sequence", stop_seq(out.last)}}},
                              {"usage", anthropic_usage(n_prompt, out.last)}}));
  c.chunk(event("message_stop", {{"type", "message_stop"}}));
  c.end_stream();
  return 200;
}

}  // namespace expertd::serve
