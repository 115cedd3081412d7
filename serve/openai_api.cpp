// The OpenAI API's side: chat messages in (tool calls and results included), completions and
// chat completions out, streamed or whole, with tool calls and log-probabilities.
#include "serve/server_impl.h"

namespace expertd::serve {

namespace {

const char* openai_finish(Finish f, const chat::Reply& r) {
  return f == Finish::Length ? "length" : called(f, r) ? "tool_calls" : "stop";
}

}  // namespace

// OpenAI messages as templates read them: content as text, tool-call arguments as objects.
ordered_json Server::Impl::openai_messages(const ordered_json& msgs) {
  if (!msgs.is_array() || msgs.empty()) throw bad_request("messages must be a non-empty array");
  ordered_json out = ordered_json::array();
  for (const auto& m : msgs) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw bad_request("each message needs a string role");
    ordered_json n = m;
    if (m.contains("content")) n["content"] = content_text(m["content"], "content");
    if (m.contains("tool_calls") && m["tool_calls"].is_array())
      for (auto& tc : n["tool_calls"])
        if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
            tc["function"].contains("arguments") && tc["function"]["arguments"].is_string()) {
          auto args =
              ordered_json::parse(tc["function"]["arguments"].get<std::string>(), nullptr, false);
          if (!args.is_discarded()) tc["function"]["arguments"] = args;
        }
    out.push_back(std::move(n));
  }
  return out;
}

// ---- log-probabilities, as each API shapes them ----
std::string Server::Impl::token_text(int32_t t) const {
  return tok.piece(t, true);
}

json Server::Impl::bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(int(ch));
  return b;
}

// Chat: {content: [{token, logprob, bytes, top_logprobs: [...]}]}.
json Server::Impl::chat_logprobs(std::span<const TokenLogprob> lps) const {
  json content = json::array();
  for (const auto& t : lps) {
    const std::string s = token_text(t.token);
    json top = json::array();
    for (const auto& [id, lp] : t.top) {
      const std::string ts = token_text(id);
      top.push_back({{"token", ts}, {"logprob", lp}, {"bytes", bytes_of(ts)}});
    }
    content.push_back(
        {{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// Completions: {tokens, token_logprobs, top_logprobs, text_offset}; `first` (echo) is the
// prompt's first token, which has no log-probability. `offset` runs on across chunks.
json Server::Impl::completion_logprobs(std::span<const TokenLogprob> lps, const int32_t* first,
                                       size_t& offset) const {
  json tokens = json::array(), lp = json::array(), top = json::array(), off = json::array();
  auto add = [&](int32_t id, json l, json t) {
    const std::string s = token_text(id);
    tokens.push_back(s), lp.push_back(std::move(l)), top.push_back(std::move(t));
    off.push_back(offset);
    offset += s.size();
  };
  if (first) add(*first, nullptr, nullptr);
  for (const auto& t : lps) {
    json alts = json::object();
    for (const auto& [id, l] : t.top) alts[token_text(id)] = l;
    add(t.token, t.logprob, alts);
  }
  return {{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", off}};
}

// logprobs / top_logprobs (chat) and logprobs / echo (completions).
void Server::Impl::logprob_params(const ordered_json& b, bool is_chat, GenParams& p) const {
  auto count = [&](const char* k) {
    const auto& v = b[k];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 20)
      throw bad_request(std::string(k) + " must be an integer in [0, 20]");
    return int(v.get<int64_t>());
  };
  if (is_chat) {
    const bool on =
        b.contains("logprobs") && b["logprobs"].is_boolean() && b["logprobs"].get<bool>();
    if (b.contains("logprobs") && !b["logprobs"].is_null() && !b["logprobs"].is_boolean())
      throw bad_request("logprobs must be a boolean");
    const bool top = b.contains("top_logprobs") && !b["top_logprobs"].is_null();
    if (top && !on) throw bad_request("top_logprobs needs logprobs: true");
    if (on) p.logprobs = top ? count("top_logprobs") : 0;
  } else {
    if (b.contains("logprobs") && !b["logprobs"].is_null()) p.logprobs = count("logprobs");
    const bool echo = b.contains("echo") && b["echo"].is_boolean() && b["echo"].get<bool>();
    p.prompt_logprobs = echo && p.logprobs >= 0;
  }
}

// The OpenAI shape of a reply's calls: ids, names and JSON arguments.
json Server::Impl::openai_calls(const chat::Reply& rep, Plan& plan) {
  json calls = json::array();
  for (size_t i = 0; i < rep.calls.size(); ++i)
    calls.push_back(
        {{"id", plan.call_id(i, Api::OpenAI)},
         {"type", "function"},
         {"function", {{"name", rep.calls[i].name}, {"arguments", rep.calls[i].arguments}}}});
  return calls;
}

int Server::Impl::openai(const std::shared_ptr<Request>& r, const ordered_json& b, Plan& plan,
                         Conn& c, bool stream, int n_prompt, bool is_chat) {
  const std::string id = random_id(is_chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_now();
  const char* object =
      is_chat ? (stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  ReplyTracker tracker(is_chat ? plan.format : nullptr, plan.parse);
  auto usage = [&](const Request::Update& u) {
    return json{{"prompt_tokens", n_prompt},
                {"completion_tokens", u.completion_tokens},
                {"total_tokens", n_prompt + u.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  };
  if (!stream) {
    Outcome out = drive(r, c, nullptr);
    if (out.gone) return 499;
    if (out.last.finish == Finish::Error) {
      c.send_json(503, error_body(Api::OpenAI, {503, "server_error", out.last.error}));
      return 503;
    }
    tracker.update(out.text, true);
    const chat::Reply& rep = tracker.reply();
    json ch{{"index", 0}};
    if (is_chat) {
      json msg{{"role", "assistant"},
               {"content",
                rep.content.empty() && !rep.calls.empty() ? json(nullptr) : json(rep.content)}};
      if (!rep.reasoning.empty()) msg["reasoning_content"] = rep.reasoning;
      if (!rep.calls.empty()) msg["tool_calls"] = openai_calls(rep, plan);
      ch["message"] = std::move(msg);
    } else {
      ch["text"] = plan.echo + out.text;
      ch["logprobs"] = nullptr;
    }
    if (r->params.logprobs >= 0) {
      size_t offset = 0;
      if (is_chat) {
        ch["logprobs"] = chat_logprobs(out.logprobs);
      } else {
        std::vector<TokenLogprob> all = out.prompt_logprobs;
        all.insert(all.end(), out.logprobs.begin(), out.logprobs.end());
        ch["logprobs"] =
            completion_logprobs(all, r->params.prompt_logprobs ? &r->prompt[0] : nullptr, offset);
      }
    }
    ch["finish_reason"] = openai_finish(out.last.finish, rep);
    json j{{"id", id},
           {"object", object},
           {"created", created},
           {"model", o.model_id},
           {"choices", json::array({ch})},
           {"usage", usage(out.last)}};
    c.send_json(200, dump(j));
    return 200;
  }
  const bool include_usage = b.contains("stream_options") && b["stream_options"].is_object() &&
                             b["stream_options"].value("include_usage", false);
  auto chunk = [&](json ch) {
    json j{{"id", id},
           {"object", object},
           {"created", created},
           {"model", o.model_id},
           {"choices", json::array({std::move(ch)})}};
    if (include_usage) j["usage"] = nullptr;
    return sse(j);
  };
  // The log-probabilities not yet sent ride on the next chunk.
  LogprobSink sink;
  std::vector<TokenLogprob>& lps = sink.gen;
  size_t lp_sent = 0, lp_offset = 0;
  bool prompt_lp_sent = false;
  auto delta_chunk = [&](json delta, const char* finish) {
    json ch{{"index", 0}};
    if (is_chat) {
      ch["delta"] = std::move(delta);
    } else {
      ch["text"] = delta.value("content", "");
      ch["logprobs"] = nullptr;
    }
    if (r->params.logprobs >= 0 && lp_sent < lps.size()) {
      const std::span<const TokenLogprob> fresh(lps.data() + lp_sent, lps.size() - lp_sent);
      ch["logprobs"] =
          is_chat ? chat_logprobs(fresh) : completion_logprobs(fresh, nullptr, lp_offset);
      lp_sent = lps.size();
    }
    ch["finish_reason"] = finish ? json(finish) : json(nullptr);
    return chunk(std::move(ch));
  };
  // One chunk per kind of news (reasoning, answer, each call's start and arguments).
  auto send_delta = [&](const ReplyDelta& d) {
    bool ok = true;
    if (!d.reasoning.empty())
      ok = ok && c.chunk(delta_chunk({{"reasoning_content", d.reasoning}}, nullptr));
    if (!d.content.empty()) ok = ok && c.chunk(delta_chunk({{"content", d.content}}, nullptr));
    for (const auto& call : d.calls) {
      json tc{{"index", call.index}};
      if (call.start) {
        tc["id"] = plan.call_id(size_t(call.index), Api::OpenAI);
        tc["type"] = "function";
        tc["function"] = {{"name", call.name}, {"arguments", ""}};
      } else {
        tc["function"] = {{"arguments", call.arguments}};
      }
      ok = ok && c.chunk(delta_chunk({{"tool_calls", json::array({tc})}}, nullptr));
    }
    return ok;
  };
  if (!c.start_stream()) {
    r->cancel();
    return 499;
  }
  if (is_chat && !c.chunk(delta_chunk({{"role", "assistant"}, {"content", ""}}, nullptr))) {
    r->cancel();
    return 499;
  }
  std::string text;
  Outcome out = drive(
      r, c,
      [&](const std::string& t) {
        text += t;
        if (!is_chat && !prompt_lp_sent && (!plan.echo.empty() || r->params.prompt_logprobs)) {
          // Echo: the prompt and its log-probabilities come first.
          prompt_lp_sent = true;
          json ch{
              {"index", 0}, {"text", plan.echo}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
          // (The prompt's are all in by its first generated token.)
          if (r->params.prompt_logprobs)
            ch["logprobs"] = completion_logprobs(sink.prompt, &r->prompt[0], lp_offset);
          if (!c.chunk(chunk(std::move(ch)))) return false;
        }
        const ReplyDelta d = tracker.update(text, false);
        if (d.reasoning.empty() && d.content.empty() && d.calls.empty() && lp_sent < lps.size())
          return c.chunk(delta_chunk(json::object(), nullptr));
        return send_delta(d);
      },
      &sink);
  if (out.gone) return 499;
  if (out.last.finish == Finish::Error) {
    c.chunk(sse(json{{"error", {{"message", out.last.error}, {"type", "server_error"}}}}));
    c.end_stream();
    c.keep_alive = false;
    return 200;
  }
  send_delta(tracker.update(text, true));
  c.chunk(delta_chunk(json::object(), openai_finish(out.last.finish, tracker.reply())));
  if (include_usage) {
    json j{{"id", id},
           {"object", object},
           {"created", created},
           {"model", o.model_id},
           {"choices", json::array()},
           {"usage", usage(out.last)}};
    c.chunk(sse(j));
  }
  c.chunk("data: [DONE]\n\n");
  c.end_stream();
  return 200;
}

}  // namespace expertd::serve
