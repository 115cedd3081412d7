// expert-serve's HTTP side (Boost.Beast): the OpenAI endpoints (/v1/models, /v1/completions,
// /v1/chat/completions, streaming as server-sent events), Anthropic's /v1/messages, /health and
// /metrics. Each connection has its own thread; generations go to a Backend (the engine loop
// in this process, or engine processes).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "chat/model_chat.h"
#include "common/result.h"
#include "engine/tokenizer.h"
#include "serve/grammar.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"

namespace expertd::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (port() says which)
  std::string api_key;  // empty: no authentication
  size_t max_body = size_t{8} << 20;
  std::string model_id;  // what /v1/models lists and requests must name
  int max_connections = 256;
};

// The model's chat template (absent: chat endpoints answer 400) and its BOS/EOS text.
using chat::ModelChat;

class Server {
 public:
  // `grammars` compiles the requests' grammars (tool_choice, response_format) to check them.
  Server(ServerOptions o, Backend& sched, const engine::Tokenizer& tok, ModelChat chat,
         Metrics& metrics, Grammars& grammars);
  ~Server();
  Status listen();
  int port() const { return port_; }
  // Accepts until stop(); each connection on its own thread.
  void run();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace expertd::serve
