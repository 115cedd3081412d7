// expert-serve's HTTP plumbing shared by the server and both APIs: one connection's writes
// (whole responses or a chunked event stream), the APIs' error bodies, ids and JSON text.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "serve/chat_request.h"

namespace expertd::serve {

enum class Api { OpenAI, Anthropic };

std::string random_id(const std::string& prefix);
int64_t unix_now();
// JSON text; bytes of the model's text that are not UTF-8 become U+FFFD rather than an exception.
std::string dump(const nlohmann::json& j);
std::string error_body(Api api, const HttpError& e);
// Server-sent events: OpenAI's data lines, Anthropic's named events.
std::string sse(const nlohmann::json& j);
std::string event(const std::string& name, const nlohmann::json& j);

// One HTTP connection's writes: full responses, or a chunked event stream. Each write must
// finish within the write deadline (a client that stops reading fills the socket's buffer): past
// it the connection is given up (`timed_out`) and the caller's request ends. Without a socket
// (the fuzz target) the bytes go to a string.
class Conn {
 public:
  Conn(int fd, std::chrono::milliseconds write_timeout) : fd_(fd), write_timeout_(write_timeout) {}
  explicit Conn(std::string* sink) : sink_(sink) {}
  bool keep_alive = true;
  bool timed_out = false;  // a write missed its deadline

  void send(int status, const std::string& content_type, const std::string& body,
            const std::vector<std::pair<std::string, std::string>>& headers = {});
  void send_json(int status, const std::string& body) { send(status, "application/json", body); }

  bool start_stream();
  bool chunk(const std::string& data);
  bool end_stream() { return raw("0\r\n\r\n"); }

  // The client closed its side (or reset): nothing more can reach it.
  bool peer_closed() const;

 private:
  bool raw(std::string_view bytes);
  int fd_ = -1;
  bool failed_ = false;
  std::chrono::milliseconds write_timeout_{0};
  std::string* sink_ = nullptr;
};

}  // namespace expertd::serve
