#include "serve/server.h"

#include <chrono>
#include <cstdio>

#include "serve/server_impl.h"

namespace expertd::serve {

bool Server::Impl::authorized(const http::fields& req) const {
  if (o.api_key.empty()) return true;
  auto auth = req[http::field::authorization];
  if (auth == "Bearer " + o.api_key) return true;
  auto x = req["x-api-key"];
  return x == o.api_key;
}

std::optional<HttpError> Server::Impl::check_headers(const http::request_header<>& req) const {
  const std::string_view target = sv(req.target());
  if (!o.api_key.empty() && (target.starts_with("/v1/") || target.starts_with("/dashboard/")) &&
      !authorized(req))
    return HttpError{401, "authentication_error",
                     "invalid API key (Authorization: Bearer or x-api-key)"};
  return std::nullopt;
}

HttpError Server::Impl::parse_error(const beast::error_code& ec, Closed& why) const {
  if (ec == http::error::body_limit) {
    why = Closed::TooLarge;
    return {413, "request_too_large",
            "the request body is over the limit of " + std::to_string(o.max_body) +
                " bytes (expert-serve --max-body-mb)"};
  }
  why = Closed::Malformed;
  if (ec == http::error::header_limit) return bad_request("the request's headers are over 64 KiB");
  return bad_request("malformed HTTP request: " + ec.message());
}

void Server::Impl::route(http::request<http::string_body>& req, Conn& c) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  const Api api = path == "/v1/messages" ? Api::Anthropic : Api::OpenAI;
  auto fail = [&](const HttpError& e, const std::string& endpoint) {
    c.send_json(e.status, error_body(api, e));
    metrics.count_request(endpoint, e.status);
  };
  if (answer_fleet(path, req, c)) return;
  if (answer_page(path, req, c)) return;
  if (path == "/metrics") {
    c.send(200, "text/plain; version=0.0.4", metrics.render(sched.daemon_metrics()));
    metrics.count_request("metrics", 200);
    return;
  }
  const bool known = path == "/v1/models" || path == "/v1/completions" ||
                     path == "/v1/chat/completions" || path == "/v1/messages";
  if (!known) return fail({404, "not_found_error", "no endpoint " + path}, "other");
  const std::string endpoint = path.substr(4);
  if (!authorized(req))
    return fail(
        {401, "authentication_error", "invalid API key (Authorization: Bearer or x-api-key)"},
        endpoint);
  if (path == "/v1/models") {
    if (req.method() != http::verb::get)
      return fail({405, "invalid_request_error", "use GET"}, endpoint);
    json j{{"object", "list"},
           {"data", json::array({{{"id", o.model_id},
                                  {"object", "model"},
                                  {"created", started},
                                  {"owned_by", "expertd"}}})}};
    c.send_json(200, dump(j));
    metrics.count_request(endpoint, 200);
    return;
  }
  if (req.method() != http::verb::post)
    return fail({405, "invalid_request_error", "use POST"}, endpoint);
  // Counted before the drain is checked: a drain that begins after this sees it and waits.
  ++generations;
  struct Done {
    std::atomic<int>& n;
    ~Done() { --n; }
  } done{generations};
  if (draining) {
    c.send(503, "application/json",
           error_body(api, {503, api == Api::Anthropic ? "overloaded_error" : "server_error",
                            "this server is draining (shutting down); retry on another"}),
           {{"Retry-After", "1"}});
    metrics.count_request(endpoint, 503);
    return;
  }
  ordered_json body = ordered_json::parse(req.body(), nullptr, false);
  if (body.is_discarded() || !body.is_object())
    return fail(bad_request("the body is not a JSON object"), endpoint);
  try {
    const int status = generate(path, body, api, c);
    metrics.count_request(endpoint, status);
  } catch (const HttpError& e) {
    fail(e, endpoint);
  } catch (const ordered_json::exception& e) {
    fail(bad_request(std::string("bad field type: ") + e.what()), endpoint);
  }
}

// ---- request parsing ----
void Server::Impl::check_model(const ordered_json& body, const std::string& id) {
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) throw bad_request("model must be a string");
    if (body["model"].get<std::string>() != id)
      throw HttpError{404, "not_found_error",
                      "model '" + body["model"].get<std::string>() +
                          "' not found; this server serves '" + id + "'"};
  }
}

GenParams Server::Impl::params(const ordered_json& b, Api api, int default_max) const {
  GenParams p;
  p.max_tokens = default_max;
  auto num = [&](const char* k) -> const ordered_json* {
    if (!b.contains(k) || b[k].is_null()) return nullptr;
    if (!b[k].is_number()) throw bad_request(std::string(k) + " must be a number");
    return &b[k];
  };
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (auto* v = num(k)) {
      if (!v->is_number_integer() || v->get<int64_t>() < 1)
        throw bad_request(std::string(k) + " must be a positive integer");
      p.max_tokens = int(std::min<int64_t>(v->get<int64_t>(), 1 << 30));
    }
  if (auto* v = num("temperature")) {
    p.temperature = v->get<float>();
    if (p.temperature < 0 || p.temperature > 2) throw bad_request("temperature must be in [0, 2]");
  }
  if (auto* v = num("top_p")) {
    p.top_p = v->get<float>();
    if (p.top_p <= 0 || p.top_p > 1) throw bad_request("top_p must be in (0, 1]");
  }
  if (auto* v = num("top_k")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 0)
      throw bad_request("top_k must be a non-negative integer");
    p.top_k = int(v->get<int64_t>());
  }
  if (auto* v = num("seed"))
    p.seed = uint64_t(v->get<int64_t>());
  else
    p.seed = std::random_device{}();
  if (auto* v = num("n"); v && v->get<int64_t>() != 1) throw bad_request("only n=1 is supported");
  // Speculative decoding per request (an extension; the OpenAI clients send it in extra_body):
  // "speculative": "ngram", "mtp" (a server started with --speculative mtp) or "none",
  // "draft_max": drafts per step (1..64).
  if (b.contains("speculative") && !b["speculative"].is_null()) {
    const auto& v = b["speculative"];
    if (!v.is_string() || (v != "none" && v != "ngram" && v != "mtp"))
      throw bad_request("speculative must be \"none\", \"ngram\" or \"mtp\"");
    if (v == "mtp" && !o.nextn)
      throw bad_request(
          "speculative \"mtp\" needs the server started with --speculative mtp (a model "
          "with a NextN block)");
    p.draft_max = v == "none" ? 0 : o.draft_max;
    if (v != "none") p.draft_source = v.get<std::string>();
  }
  if (auto* v = num("draft_max")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > 64)
      throw bad_request("draft_max must be an integer in [1, 64]");
    if (p.draft_max != 0) p.draft_max = int(v->get<int64_t>());
  }
  const char* stop_key = api == Api::Anthropic ? "stop_sequences" : "stop";
  if (b.contains(stop_key) && !b[stop_key].is_null()) {
    const auto& s = b[stop_key];
    if (s.is_string()) {
      p.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const auto& x : s) {
        if (!x.is_string()) throw bad_request(std::string(stop_key) + " must hold strings");
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      throw bad_request(std::string(stop_key) + " must be a string or an array of strings");
    }
  }
  return p;
}

// Text parts of a message's content joined (images and other parts are refused).
std::string Server::Impl::content_text(const ordered_json& content, const char* what) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw bad_request(std::string(what) + " must be a string or an array of parts");
  std::string out;
  for (const auto& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw bad_request(std::string(what) + ": only text parts are supported");
    out += part["text"].get<std::string>();
  }
  return out;
}

Server::Impl::Rendered Server::Impl::render_chat(const ordered_json& messages,
                                                 const ordered_json& body,
                                                 const ordered_json& tools, Api api) const {
  if (!chat.tmpl)
    throw bad_request(
        "this model has no chat template (tokenizer.chat_template): use "
        "/v1/completions, or start expert-serve with --chat-template FILE");
  chat::ChatOptions co;
  if (!tools.empty()) co.tools = tools;
  if (body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object())
    co.extra = body["chat_template_kwargs"];
  if (body.contains("reasoning_effort") && body["reasoning_effort"].is_string())
    co.extra["reasoning_effort"] = body["reasoning_effort"];
  if (api == Api::Anthropic && body.contains("thinking") && body["thinking"].is_object()) {
    const std::string t = body["thinking"].value("type", "");
    if (t != "enabled" && t != "disabled")
      throw bad_request("thinking.type must be enabled or disabled");
    // The families name the switch differently (Qwen3/GLM enable_thinking, DeepSeek/Kimi
    // thinking).
    co.extra["enable_thinking"] = t == "enabled";
    co.extra["thinking"] = t == "enabled";
  }
  auto text = chat.render(messages, co);
  if (!text) throw bad_request(text.error().message);
  return {tok.encode(*text, chat.needs_bos(tok, *text), true),
          chat::prompt_opens_reasoning(chat.reply, *text)};
}

// Tools, tool choice and response format: the reply's parser and, where the request forces
// a call or a JSON answer, the grammar the sampler follows.
void Server::Impl::plan_reply(const ordered_json& b, Api api, const ordered_json& tools,
                              bool in_reasoning, Plan& plan, GenParams& p) {
  const chat::ReplyFormat& f = chat.reply;
  plan.format = &f;
  plan.parse.starts_in_reasoning = in_reasoning;
  plan.parse.tools = tools;
  ToolChoice choice;
  if (b.contains("tool_choice"))
    choice = api == Api::Anthropic ? anthropic_tool_choice(b["tool_choice"], tools)
                                   : openai_tool_choice(b["tool_choice"], tools);
  plan.parse.calls = !tools.empty() && choice.mode != ToolChoice::Mode::None;
  p.special_text = f.tools != chat::ToolSyntax::None;
  p.turn_end = f.reply_end;
  const std::string prefix = reply_prefix(f, in_reasoning);
  if (choice.mode == ToolChoice::Mode::Required || choice.mode == ToolChoice::Mode::Named) {
    p.grammar = call_grammar(f, tools, choice, prefix);
  } else {
    const char* key = api == Api::Anthropic ? "output_format" : "response_format";
    if (b.contains(key) && !b[key].is_null()) {
      const auto& rf = b[key];
      const std::string type = rf.is_object() ? rf.value("type", "") : "";
      if (type == "json_object") {
        p.grammar = json_grammar(nullptr, prefix);
      } else if (type == "json_schema") {
        const ordered_json* schema = nullptr;
        if (api == Api::OpenAI && rf.contains("json_schema") && rf["json_schema"].is_object() &&
            rf["json_schema"].contains("schema"))
          schema = &rf["json_schema"]["schema"];
        else if (api == Api::Anthropic && rf.contains("schema"))
          schema = &rf["schema"];
        if (!schema)
          throw bad_request(std::string(key) +
                            (api == Api::OpenAI ? ".json_schema.schema" : ".schema") +
                            " is required");
        check_schema(*schema, std::string(key) + ".schema");
        p.grammar = json_grammar(schema, prefix);
      } else if (type != "text") {
        throw bad_request(std::string(key) + ".type must be text, json_object or json_schema");
      }
    }
  }
  if (p.grammar) {
    if (auto g = grammars.compile(p.grammar); !g) throw bad_request(g.error().message);
  }
}

Server::Impl::Outcome Server::Impl::drive(const std::shared_ptr<Request>& r, Conn& c,
                                          const std::function<bool(const std::string&)>& on_text,
                                          LogprobSink* lps) {
  Outcome out;
  for (;;) {
    Request::Update u = r->take(std::chrono::milliseconds(50));
    const bool new_lp = !u.logprobs.empty();
    for (auto& x : u.prompt_logprobs) {
      if (lps) lps->prompt.push_back(x);
      out.prompt_logprobs.push_back(std::move(x));
    }
    for (auto& x : u.logprobs) {
      if (lps) lps->gen.push_back(x);
      out.logprobs.push_back(std::move(x));
    }
    if (!u.text.empty() || new_lp) {
      out.text += u.text;
      if (on_text && !on_text(u.text)) {
        r->cancel();
        out.gone = true;
        return out;
      }
    }
    if (u.done) {
      out.last = std::move(u);
      return out;
    }
    if (c.peer_closed() || stopping) {
      r->cancel();
      out.gone = true;
      return out;
    }
  }
}

int Server::Impl::generate(const std::string& path, const ordered_json& b, Api api, Conn& c) {
  check_model(b, o.model_id);
  const bool stream = b.contains("stream") && b["stream"].is_boolean() && b["stream"].get<bool>();
  std::vector<int32_t> prompt;
  const int n_ctx = sched.n_ctx();
  int default_max = 16;
  ordered_json tools = ordered_json::array();
  bool in_reasoning = false, is_chat = false;
  if (path == "/v1/completions") {
    if (!b.contains("prompt")) throw bad_request("prompt is required");
    const auto& pr = b["prompt"];
    if (pr.is_string()) {
      prompt = tok.encode(pr.get<std::string>(), tok.add_bos(), true);
    } else if (pr.is_array() && pr.size() == 1 && pr[0].is_string()) {
      prompt = tok.encode(pr[0].get<std::string>(), tok.add_bos(), true);
    } else if (pr.is_array() && !pr.empty() && pr[0].is_number_integer()) {
      for (const auto& t : pr) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab())
          throw bad_request("prompt token ids must be in [0, " + std::to_string(tok.n_vocab()) +
                            ")");
        prompt.push_back(int32_t(t.get<int64_t>()));
      }
    } else {
      throw bad_request("prompt must be a string, one string in an array, or token ids");
    }
  } else {
    const bool oa = path == "/v1/chat/completions";
    if (!oa && !b.contains("max_tokens")) throw bad_request("max_tokens is required");
    if (oa) default_max = 1 << 30;  // until the end of the text or the context
    if (b.contains("tools") && !b["tools"].is_null() &&
        !(b["tools"].is_array() && b["tools"].empty())) {
      tools = oa ? check_tools(b["tools"], "tools") : anthropic_tools(b["tools"]);
      if (chat.tmpl && chat.reply.tools == chat::ToolSyntax::None)
        throw bad_request(
            "this model's chat template has no tool-call format expert-serve knows (none of "
            "the Qwen3/Hermes, Qwen3-Coder, GLM, Kimi-K2/K3, DeepSeek V3.1/V3.2/V4, MiniMax-M2/M3, "
            "Hy3 or gpt-oss markers): tools cannot be offered to it");
    }
    const ordered_json msgs =
        oa ? openai_messages(b.value("messages", ordered_json())) : anthropic_messages(b);
    Rendered rd = render_chat(msgs, b, tools, oa ? Api::OpenAI : Api::Anthropic);
    prompt = std::move(rd.tokens);
    in_reasoning = rd.in_reasoning;
    is_chat = true;
  }
  if (prompt.empty()) throw bad_request("the prompt is empty");
  if (int(prompt.size()) >= n_ctx)
    throw bad_request("the prompt is " + std::to_string(prompt.size()) +
                      " tokens; the context holds " + std::to_string(n_ctx) +
                      " (expert-serve --ctx), and the reply needs room");
  GenParams p = params(b, api, default_max);
  // A reply cannot outgrow the context: max_tokens beyond what is left after the prompt is
  // capped there (the reply ends with finish_reason "length" / stop_reason "max_tokens").
  p.max_tokens = std::min(p.max_tokens, n_ctx - int(prompt.size()));
  if (api == Api::OpenAI) logprob_params(b, is_chat, p);
  Plan plan;
  if (is_chat) plan_reply(b, api, tools, in_reasoning, plan, p);
  if (!is_chat && b.contains("echo") && b["echo"].is_boolean() && b["echo"].get<bool>()) {
    const auto& pr = b["prompt"];
    if (pr.is_string() || (pr.is_array() && pr[0].is_string())) {
      plan.echo = pr.is_string() ? pr.get<std::string>() : pr[0].get<std::string>();
    } else {
      for (int32_t t : prompt) plan.echo += tok.piece(t, true);
    }
  }
  auto r = std::make_shared<Request>(prompt, p);
  switch (sched.submit(r)) {
    case Generator::Admit::Ok:
      break;
    case Generator::Admit::QueueFull:
      c.send(503, "application/json",
             error_body(api, {503, api == Api::Anthropic ? "overloaded_error" : "server_error",
                              "the request queue is full (expert-serve --queue-max); retry"}),
             {{"Retry-After", "1"}});
      return 503;
    case Generator::Admit::Unavailable:
      c.send(503, "application/json",
             error_body(api, {503, api == Api::Anthropic ? "api_error" : "server_error",
                              "the engine is not available: " + sched.last_error()}),
             {{"Retry-After", "1"}});
      return 503;
  }
  const int n_prompt = int(prompt.size());
  if (path == "/v1/messages") return anthropic(r, plan, c, stream, n_prompt);
  return openai(r, b, plan, c, stream, n_prompt, path == "/v1/chat/completions");
}

}  // namespace expertd::serve
