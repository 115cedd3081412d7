// expert-serve's HTTP side (Boost.Beast): the OpenAI endpoints (/v1/models, /v1/completions,
// /v1/chat/completions, streaming as server-sent events), Anthropic's /v1/messages, /health and
// /metrics, and what gateways in front of several servers read (serve/fleet.cpp: /server_info,
// /model_info, /get_load, readiness and drain). Connections are read and written asynchronously on
// a few I/O threads (serve/front.cpp) under deadlines and caps; a request, once read, is answered
// on a thread of its own; generations go to a Generator (the engine loop in this process, or engine
// processes).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "chat/model_chat.h"
#include "common/result.h"
#include "engine/tokenizer.h"
#include "serve/grammar.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"

namespace expertd::serve {

class WebFiles;
class Dashboard;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (port() says which)
  std::string api_key;  // empty: no authentication
  size_t max_body = size_t{8} << 20;
  std::string model_id;  // what /v1/models lists and requests must name
  // What /server_info and /model_info tell a gateway (serve/fleet.cpp).
  std::string model_path;  // the GGUF served
  std::string model_arch;  // its general.architecture
  int sequences_max = 0;   // decoded at once: engine processes x --parallel
  int queue_max = 0;       // waiting beyond them
  // The drafts per step a request's "speculative" gets without its own draft_max.
  int draft_max = 8;
  bool nextn = false;  // the engines run the model's NextN block: "speculative": "mtp" drafts
  // The front's limits (README "Limits"): a slow or hostile client costs a socket and a timer,
  // never a thread, and cannot hold the places of real ones.
  int max_connections = 10000;         // established connections (past their first headers)
  int pending_connections_max = 1024;  // not yet: when full, the oldest is closed for a new one
  int peer_connections_max = 256;      // from one address, of each kind (0: no cap)
  int requests_max = 512;              // being answered at once; /health, /metrics have 16 more
  double header_timeout_s = 10;        // request line and headers, from the first byte
  double body_timeout_s = 60;          // the whole body, from the end of the headers
  double keepalive_s = 30;             // idle between requests
  double write_timeout_s = 30;         // each write of a response (a client that stops reading)
  int io_threads = 2;
};

// The model's chat template (absent: chat endpoints answer 400) and its BOS/EOS text.
using chat::ModelChat;

class Server {
 public:
  // `grammars` compiles the requests' grammars (tool_choice, response_format) to check them.
  Server(ServerOptions o, Generator& sched, const engine::Tokenizer& tok, ModelChat chat,
         Metrics& metrics, Grammars& grammars);
  ~Server();
  // The page at / and its dashboard's data (serve/page.cpp); before listen(). Either may be null.
  void serve_page(const WebFiles* web, Dashboard* dashboard);
  Status listen();
  int port() const { return port_; }
  // Serves until stop(), on this thread and io_threads - 1 more.
  void run();
  // A rolling restart's first half (SIGTERM): /health answers 503 and new generations 503 with
  // Retry-After, while those running go on; stop() then ends whatever is left.
  void drain();
  // Generations being answered: a drain waits for 0.
  int generations() const;
  void stop();
  // One request's bytes answered as a connection would answer them (no deadlines, no engine
  // beyond the Generator): the HTTP fuzz target's entry. Empty while the request is incomplete.
  std::string answer(std::string_view bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace expertd::serve
