// expert-serve's HTTP plumbing shared by the server and both APIs: one connection's writes
// (whole responses or a chunked event stream), the APIs' error bodies, ids and JSON text.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
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

// One HTTP connection: full responses, or a chunked event stream.
class Conn {
 public:
  explicit Conn(boost::asio::ip::tcp::socket& s) : s_(s) {}
  bool keep_alive = true;

  void send(int status, const std::string& content_type, const std::string& body,
            const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    boost::beast::http::response<boost::beast::http::string_body> res{
        static_cast<boost::beast::http::status>(status), 11};
    res.set(boost::beast::http::field::server, "expert-serve");
    res.set(boost::beast::http::field::content_type, content_type);
    for (const auto& [k, v] : headers) res.set(k, v);
    res.keep_alive(keep_alive);
    res.body() = body;
    res.prepare_payload();
    boost::beast::error_code ec;
    boost::beast::http::write(s_, res, ec);
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
    boost::beast::error_code ec;
    boost::asio::write(s_, boost::asio::buffer(bytes), ec);
    if (ec) keep_alive = false;
    return !ec;
  }
  boost::asio::ip::tcp::socket& s_;
};

}  // namespace expertd::serve
