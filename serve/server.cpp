#include "serve/server.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <thread>

#include "serve/chat_request.h"

namespace expertd::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::ordered_json;
using json = nlohmann::json;

namespace {

enum class Api { OpenAI, Anthropic };

std::string random_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char b[32];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(rng()));
  return prefix + b;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// JSON text; bytes of the model's text that are not UTF-8 become U+FFFD rather than an exception.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_body(Api api, const HttpError& e) {
  if (api == Api::Anthropic)
    return dump(json{{"type", "error"}, {"error", {{"type", e.type}, {"message", e.message}}}});
  return dump(
      json{{"error",
            {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}}}});
}

// One HTTP connection: full responses, or a chunked event stream.
class Conn {
 public:
  explicit Conn(tcp::socket& s) : s_(s) {}
  bool keep_alive = true;

  void send(int status, const std::string& content_type, const std::string& body,
            const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    http::response<http::string_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::server, "expert-serve");
    res.set(http::field::content_type, content_type);
    for (const auto& [k, v] : headers) res.set(k, v);
    res.keep_alive(keep_alive);
    res.body() = body;
    res.prepare_payload();
    beast::error_code ec;
    http::write(s_, res, ec);
    if (ec) keep_alive = false;
  }
  void send_json(int status, const std::string& body) { send(status, "application/json", body); }

  bool start_stream() {
    static const std::string head =
        "HTTP/1.1 200 OK\r\nServer: expert-serve\r\nContent-Type: text/event-stream\r\n"
        "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
    return raw(head);
  }
  bool chunk(const std::string& data) {
    if (data.empty()) return true;
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return raw(size + data + "\r\n");
  }
  bool end_stream() { return raw("0\r\n\r\n"); }

  // The client closed its side (or reset): nothing more can reach it.
  bool peer_closed() {
    pollfd p{s_.native_handle(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
    char c;
    return ::recv(s_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }

 private:
  bool raw(const std::string& bytes) {
    beast::error_code ec;
    net::write(s_, net::buffer(bytes), ec);
    if (ec) keep_alive = false;
    return !ec;
  }
  tcp::socket& s_;
};

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}
std::string event(const std::string& name, const json& j) {
  return "event: " + name + "\ndata: " + dump(j) + "\n\n";
}

// A reply that ends with complete calls (and not cut by max_tokens) is a tool-call turn.
bool called(Finish f, const chat::Reply& r) {
  if (f == Finish::Length || r.calls.empty()) return false;
  for (const auto& c : r.calls)
    if (!c.complete) return false;
  return true;
}
const char* openai_finish(Finish f, const chat::Reply& r) {
  return f == Finish::Length ? "length" : called(f, r) ? "tool_calls" : "stop";
}
const char* anthropic_stop(Finish f, const chat::Reply& r) {
  return f == Finish::Length         ? "max_tokens"
         : called(f, r)              ? "tool_use"
         : f == Finish::StopSequence ? "stop_sequence"
                                     : "end_turn";
}

// What a chat request asks of its reply: how to read it, which tools it may call.
struct Plan {
  const chat::ReplyFormat* format = nullptr;  // null: the text is all answer
  chat::ParseOptions parse;
  std::vector<std::string> call_ids;  // one per call, made as calls appear
  std::string echo;                   // completions with echo: the prompt's text, returned first
  const std::string& call_id(size_t i, Api api) {
    while (call_ids.size() <= i)
      call_ids.push_back(random_id(api == Api::Anthropic ? "toolu_" : "call_"));
    return call_ids[i];
  }
};

}  // namespace

struct Server::Impl {
  ServerOptions o;
  Backend& sched;
  const engine::Tokenizer& tok;
  ModelChat chat;
  Metrics& metrics;
  Grammars& grammars;
  net::io_context io;
  tcp::acceptor acceptor{io};
  std::atomic<bool> stopping{false};
  std::atomic<int> connections{0};
  const int64_t started = unix_now();

  Impl(ServerOptions opts, Backend& s, const engine::Tokenizer& t, ModelChat c, Metrics& m,
       Grammars& g)
      : o(std::move(opts)), sched(s), tok(t), chat(std::move(c)), metrics(m), grammars(g) {}

  void handle(tcp::socket sock) {
    beast::flat_buffer buf;
    Conn c(sock);
    while (c.keep_alive && !stopping) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(o.max_body);
      parser.header_limit(64 * 1024);
      beast::error_code ec;
      http::read(sock, buf, parser, ec);
      if (ec == http::error::end_of_stream || ec == net::error::eof ||
          ec == net::error::connection_reset)
        break;
      if (ec == http::error::body_limit) {
        c.keep_alive = false;
        c.send_json(413, error_body(Api::OpenAI, {413, "request_too_large",
                                                  "the request body is over the limit of " +
                                                      std::to_string(o.max_body) + " bytes"}));
        metrics.count_request("other", 413);
        // Let the client finish sending (and so read the answer) before the connection closes.
        beast::error_code ig;
        sock.shutdown(tcp::socket::shutdown_send, ig);
        char sink[65536];
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        pollfd p{sock.native_handle(), POLLIN, 0};
        while (std::chrono::steady_clock::now() < until && ::poll(&p, 1, 200) > 0 &&
               ::recv(sock.native_handle(), sink, sizeof sink, 0) > 0) {
        }
        break;
      }
      if (ec) {
        c.keep_alive = false;
        c.send_json(
            400, error_body(Api::OpenAI, bad_request("malformed HTTP request: " + ec.message())));
        break;
      }
      auto& req = parser.get();
      c.keep_alive = req.keep_alive();
      route(req, c);
    }
    beast::error_code ec;
    sock.shutdown(tcp::socket::shutdown_both, ec);
    sock.close(ec);
  }

  bool authorized(const http::request<http::string_body>& req) const {
    if (o.api_key.empty()) return true;
    auto auth = req[http::field::authorization];
    if (auth == "Bearer " + o.api_key) return true;
    auto x = req["x-api-key"];
    return x == o.api_key;
  }

  void route(http::request<http::string_body>& req, Conn& c) {
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    const Api api = path == "/v1/messages" ? Api::Anthropic : Api::OpenAI;
    auto fail = [&](const HttpError& e, const std::string& endpoint) {
      c.send_json(e.status, error_body(api, e));
      metrics.count_request(endpoint, e.status);
    };
    if (path == "/health") {
      const bool ok = sched.healthy();
      c.send_json(ok ? 200 : 503,
                  ok ? dump(json{{"status", "ok"}})
                     : dump(json{{"status", "unavailable"}, {"error", sched.last_error()}}));
      metrics.count_request("health", ok ? 200 : 503);
      return;
    }
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

  static void check_model(const ordered_json& body, const std::string& id) {
    if (body.contains("model") && !body["model"].is_null()) {
      if (!body["model"].is_string()) throw bad_request("model must be a string");
      if (body["model"].get<std::string>() != id)
        throw HttpError{404, "not_found_error",
                        "model '" + body["model"].get<std::string>() +
                            "' not found; this server serves '" + id + "'"};
    }
  }

  GenParams params(const ordered_json& b, Api api, int default_max) const {
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
      if (p.temperature < 0 || p.temperature > 2)
        throw bad_request("temperature must be in [0, 2]");
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
  static std::string content_text(const ordered_json& content, const char* what) {
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

  // OpenAI messages as templates read them: content as text, tool-call arguments as objects.
  static ordered_json openai_messages(const ordered_json& msgs) {
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

  // Anthropic's messages as templates read them (OpenAI's shape): tool_use blocks become the
  // assistant's tool_calls, tool_result blocks tool messages, thinking blocks its reasoning.
  static ordered_json anthropic_messages(const ordered_json& b) {
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
      if (role != "user" && role != "assistant")
        throw bad_request("role must be user or assistant");
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

  struct Rendered {
    std::vector<int32_t> tokens;
    bool in_reasoning = false;
  };
  Rendered render_chat(const ordered_json& messages, const ordered_json& body,
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
  void plan_reply(const ordered_json& b, Api api, const ordered_json& tools, bool in_reasoning,
                  Plan& plan, GenParams& p) {
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

  // ---- generation ----

  struct Outcome {
    std::string text;
    Request::Update last;
    bool gone = false;
    std::vector<TokenLogprob> logprobs, prompt_logprobs;
  };
  // Runs r to its end, handing each new piece of text (and new log-probabilities, gathered in
  // `lps`) to on_text (streaming: false when the client cannot be written to); a client that
  // goes away cancels it at once.
  struct LogprobSink {
    std::vector<TokenLogprob> gen, prompt;
  };
  Outcome drive(const std::shared_ptr<Request>& r, Conn& c,
                const std::function<bool(const std::string&)>& on_text,
                LogprobSink* lps = nullptr) {
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

  // ---- log-probabilities, as each API shapes them ----

  std::string token_text(int32_t t) const { return tok.piece(t, true); }
  static json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(int(ch));
    return b;
  }
  // Chat: {content: [{token, logprob, bytes, top_logprobs: [...]}]}.
  json chat_logprobs(std::span<const TokenLogprob> lps) const {
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
  json completion_logprobs(std::span<const TokenLogprob> lps, const int32_t* first,
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
    return {
        {"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", off}};
  }

  // logprobs / top_logprobs (chat) and logprobs / echo (completions).
  void logprob_params(const ordered_json& b, bool is_chat, GenParams& p) const {
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

  int generate(const std::string& path, const ordered_json& b, Api api, Conn& c) {
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
              "the Qwen3/Hermes, Qwen3-Coder, GLM, Kimi-K2/K3, DeepSeek V3.1/V3.2/V4 or gpt-oss "
              "markers): tools cannot be offered to it");
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
      case Backend::Admit::Ok:
        break;
      case Backend::Admit::QueueFull:
        c.send(503, "application/json",
               error_body(api, {503, api == Api::Anthropic ? "overloaded_error" : "server_error",
                                "the request queue is full (expert-serve --queue-max); retry"}),
               {{"Retry-After", "1"}});
        return 503;
      case Backend::Admit::Unavailable:
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

  // The OpenAI shape of a reply's calls: ids, names and JSON arguments.
  static json openai_calls(const chat::Reply& rep, Plan& plan) {
    json calls = json::array();
    for (size_t i = 0; i < rep.calls.size(); ++i)
      calls.push_back(
          {{"id", plan.call_id(i, Api::OpenAI)},
           {"type", "function"},
           {"function", {{"name", rep.calls[i].name}, {"arguments", rep.calls[i].arguments}}}});
    return calls;
  }

  int openai(const std::shared_ptr<Request>& r, const ordered_json& b, Plan& plan, Conn& c,
             bool stream, int n_prompt, bool is_chat) {
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
            json ch{{"index", 0},
                    {"text", plan.echo},
                    {"logprobs", nullptr},
                    {"finish_reason", nullptr}};
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

  // A call's input as Anthropic carries it: an object (an unfinished call's is empty; the
  // stop_reason max_tokens says it was cut).
  static json call_input(const chat::ToolCall& call) {
    if (!call.complete) return json::object();
    json j = json::parse(call.arguments, nullptr, false);
    return j.is_object() ? j : json::object();
  }

  // Anthropic counts the prompt tokens read from the cache apart from input_tokens.
  static json anthropic_usage(int n_prompt, const Request::Update& u) {
    return {{"input_tokens", n_prompt - u.cached_tokens},
            {"output_tokens", u.completion_tokens},
            {"cache_read_input_tokens", u.cached_tokens},
            {"cache_creation_input_tokens", 0}};
  }

  int anthropic(const std::shared_ptr<Request>& r, Plan& plan, Conn& c, bool stream, int n_prompt) {
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
        ok = c.chunk(
            event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}}));
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
};

Server::Server(ServerOptions o, Backend& sched, const engine::Tokenizer& tok, ModelChat chat,
               Metrics& metrics, Grammars& grammars)
    : impl_(std::make_unique<Impl>(std::move(o), sched, tok, std::move(chat), metrics, grammars)) {}

Server::~Server() {
  stop();
}

Status Server::listen() {
  beast::error_code ec;
  auto addr = net::ip::make_address(impl_->o.host, ec);
  if (ec) return make_error("--host " + impl_->o.host + ": " + ec.message());
  tcp::endpoint ep{addr, static_cast<unsigned short>(impl_->o.port)};
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return make_error("cannot listen on " + impl_->o.host + ":" + std::to_string(impl_->o.port) +
                      ": " + ec.message());
  port_ = a.local_endpoint().port();
  return {};
}

void Server::run() {
  Impl& im = *impl_;
  while (!im.stopping) {
    tcp::socket s{im.io};
    beast::error_code ec;
    im.acceptor.accept(s, ec);
    if (ec) {
      if (im.stopping) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // EMFILE and the like
      continue;
    }
    if (im.connections >= im.o.max_connections) {
      Conn c(s);
      c.keep_alive = false;
      c.send(503, "application/json",
             error_body(Api::OpenAI, {503, "server_error", "too many connections"}),
             {{"Retry-After", "1"}});
      continue;
    }
    ++im.connections;
    std::thread([&im, sock = std::move(s)]() mutable {
      im.handle(std::move(sock));
      --im.connections;
    }).detach();
  }
}

void Server::stop() {
  if (impl_->stopping.exchange(true)) return;
  // shutdown() wakes an accept() blocked on another thread (Linux); then close.
  if (impl_->acceptor.is_open()) ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
  beast::error_code ec;
  impl_->acceptor.close(ec);
  // Connection threads see `stopping` within 50 ms and end their requests.
  for (int i = 0; i < 100 && impl_->connections > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace expertd::serve
