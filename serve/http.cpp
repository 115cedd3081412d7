#include "serve/http.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

namespace expertd::serve {

using json = nlohmann::json;

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

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}
std::string event(const std::string& name, const json& j) {
  return "event: " + name + "\ndata: " + dump(j) + "\n\n";
}

void Conn::send(int status, const std::string& content_type, const std::string& body,
                const std::vector<std::pair<std::string, std::string>>& headers) {
  namespace http = boost::beast::http;
  http::response<http::string_body> res{static_cast<http::status>(status), 11};
  res.set(http::field::server, "expert-serve");
  res.set(http::field::content_type, content_type);
  for (const auto& [k, v] : headers) res.set(k, v);
  res.keep_alive(keep_alive);
  res.body() = body;
  res.prepare_payload();
  std::ostringstream text;
  text << res;
  raw(text.str());
}

bool Conn::start_stream() {
  static const std::string head =
      "HTTP/1.1 200 OK\r\nServer: expert-serve\r\nContent-Type: text/event-stream\r\n"
      "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
  return raw(head);
}

bool Conn::chunk(const std::string& data) {
  if (data.empty()) return true;
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return raw(size + data + "\r\n");
}

bool Conn::peer_closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  char c;
  return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

bool Conn::raw(std::string_view bytes) {
  if (sink_) {
    sink_->append(bytes);
    return true;
  }
  if (fd_ < 0 || failed_) return false;  // after a failed write the stream is cut mid-message
  const auto until = std::chrono::steady_clock::now() + write_timeout_;
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      bytes.remove_prefix(size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        break;
      }
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, int(left.count())) < 0 && errno != EINTR) break;
      continue;  // writable, an error (the next send says which) or the deadline (checked above)
    }
    break;  // the peer reset or closed
  }
  if (bytes.empty()) return true;
  failed_ = true;
  keep_alive = false;
  return false;
}

}  // namespace expertd::serve
