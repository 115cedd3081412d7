// The server's inside, shared by its rooms: front.cpp (connections: reading, deadlines, caps),
// server.cpp (routing, the request's parameters and prompt, generation), openai_api.cpp and
// anthropic_api.cpp (each API's messages in and replies out).
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "serve/chat_request.h"
#include "serve/http.h"
#include "serve/server.h"

namespace expertd::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::ordered_json;
using json = nlohmann::json;

inline std::string_view sv(beast::string_view v) {
  return {v.data(), v.size()};
}

// A reply that ends with complete calls (and not cut by max_tokens) is a tool-call turn.
inline bool called(Finish f, const chat::Reply& r) {
  if (f == Finish::Length || r.calls.empty()) return false;
  for (const auto& c : r.calls)
    if (!c.complete) return false;
  return true;
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

struct Server::Impl {
  ServerOptions o;
  Generator& sched;
  const engine::Tokenizer& tok;
  ModelChat chat;
  Metrics& metrics;
  Grammars& grammars;
  // front.cpp: the connections' bookkeeping, and one connection. Declared before the I/O
  // context: connections still queued there are destroyed with it, and leave the bookkeeping.
  struct Front;
  struct Session;
  std::unique_ptr<Front> front;
  net::io_context io;
  tcp::acceptor acceptor{net::make_strand(io)};
  net::steady_timer accept_retry{acceptor.get_executor()};
  std::atomic<bool> stopping{false};
  std::atomic<bool> draining{false};
  std::atomic<int> handlers{0};     // requests being answered (each on its thread)
  std::atomic<int> generations{0};  // of which generations (completions, chat, messages)
  const int64_t started = unix_now();
  void accept();
  void admit(tcp::socket s);

  Impl(ServerOptions opts, Generator& s, const engine::Tokenizer& t, ModelChat c, Metrics& m,
       Grammars& g);  // front.cpp, with ~Impl

  ~Impl();
  bool authorized(const http::fields& req) const;
  // A request's headers, before its body is read: the 401 of a /v1/ request without the key.
  std::optional<HttpError> check_headers(const http::request_header<>& req) const;
  // A parse error's answer (400 malformed, 413 too large) and its closure's reason.
  HttpError parse_error(const beast::error_code& ec, Closed& why) const;
  void route(http::request<http::string_body>& req, Conn& c);
  // fleet.cpp: what a gateway asks a worker (/health, /server_info, /model_info, /get_load and
  // their get_ names); false if `path` is none of them.
  bool answer_fleet(const std::string& path, const http::request<http::string_body>& req, Conn& c);
  // page.cpp: the page's files (/, /web/...) and the dashboard's data (/dashboard/...); false if
  // `path` is none of them.
  const WebFiles* web = nullptr;
  Dashboard* dashboard = nullptr;
  bool answer_page(const std::string& path, const http::request<http::string_body>& req, Conn& c);
  void dashboard_events(Conn& c);

  // ---- request parsing ----
  static void check_model(const ordered_json& body, const std::string& id);
  GenParams params(const ordered_json& b, Api api, int default_max) const;

  // Text parts of a message's content joined (images and other parts are refused).
  static std::string content_text(const ordered_json& content, const char* what);

  // OpenAI messages as templates read them: content as text, tool-call arguments as objects.
  static ordered_json openai_messages(const ordered_json& msgs);

  // Anthropic's messages as templates read them (OpenAI's shape): tool_use blocks become the
  // assistant's tool_calls, tool_result blocks tool messages, thinking blocks its reasoning.
  static ordered_json anthropic_messages(const ordered_json& b);

  struct Rendered {
    std::vector<int32_t> tokens;
    bool in_reasoning = false;
  };

  Rendered render_chat(const ordered_json& messages, const ordered_json& body,
                       const ordered_json& tools, Api api) const;

  // Tools, tool choice and response format: the reply's parser and, where the request forces
  // a call or a JSON answer, the grammar the sampler follows.
  void plan_reply(const ordered_json& b, Api api, const ordered_json& tools, bool in_reasoning,
                  Plan& plan, GenParams& p);

  // ---- generation ----
  struct Outcome {
    std::string text;
    Request::Update last;
    bool gone = false;
    std::vector<TokenLogprob> logprobs, prompt_logprobs;
  };

  struct LogprobSink {
    std::vector<TokenLogprob> gen, prompt;
  };
  // Runs r to its end, handing each new piece of text (and new log-probabilities, gathered in
  // `lps`) to on_text (streaming: false when the client cannot be written to); a client that
  // goes away cancels it at once.
  Outcome drive(const std::shared_ptr<Request>& r, Conn& c,
                const std::function<bool(const std::string&)>& on_text, LogprobSink* lps = nullptr);

  // ---- log-probabilities, as each API shapes them ----
  std::string token_text(int32_t t) const;
  static json bytes_of(const std::string& s);

  // Chat: {content: [{token, logprob, bytes, top_logprobs: [...]}]}.
  json chat_logprobs(std::span<const TokenLogprob> lps) const;

  // Completions: {tokens, token_logprobs, top_logprobs, text_offset}; `first` (echo) is the
  // prompt's first token, which has no log-probability. `offset` runs on across chunks.
  json completion_logprobs(std::span<const TokenLogprob> lps, const int32_t* first,
                           size_t& offset) const;

  // logprobs / top_logprobs (chat) and logprobs / echo (completions).
  void logprob_params(const ordered_json& b, bool is_chat, GenParams& p) const;

  int generate(const std::string& path, const ordered_json& b, Api api, Conn& c);

  // The OpenAI shape of a reply's calls: ids, names and JSON arguments.
  static json openai_calls(const chat::Reply& rep, Plan& plan);

  int openai(const std::shared_ptr<Request>& r, const ordered_json& b, Plan& plan, Conn& c,
             bool stream, int n_prompt, bool is_chat);

  // A call's input as Anthropic carries it: an object (an unfinished call's is empty; the
  // stop_reason max_tokens says it was cut).
  static json call_input(const chat::ToolCall& call);

  // Anthropic counts the prompt tokens read from the cache apart from input_tokens.
  static json anthropic_usage(int n_prompt, const Request::Update& u);
  int anthropic(const std::shared_ptr<Request>& r, Plan& plan, Conn& c, bool stream, int n_prompt);
};

}  // namespace expertd::serve
