// expert-serve's front: connections accepted and read asynchronously on a few I/O threads, each
// under deadlines (headers, body, keep-alive, every write) and caps (per address; connections not
// yet past their first request's headers and key apart from established ones; requests being
// answered), so that a slow or hostile client costs a socket and a timer, never a thread, and
// cannot take the places of real ones. A request, once read, is answered on a thread of its own
// (route(): a generation may stream for minutes), then its connection comes back here.
#include <sys/socket.h>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "serve/server_impl.h"

namespace expertd::serve {

namespace {

std::chrono::milliseconds ms(double s) {
  return std::chrono::milliseconds(int64_t(s * 1000));
}

// /health, /metrics and /get_load are answered past the caps (a small reserve of their own), so
// that an operator, and a gateway weighing load, can see a server under a flood.
bool reserved(std::string_view target) {
  const std::string_view path = target.substr(0, target.find('?'));
  return path == "/health" || path == "/metrics" || path == "/get_load";
}
constexpr int kReservedRequests = 16;

std::string endpoint_of(std::string_view target) {
  std::string path(target.substr(0, target.find('?')));
  return path.starts_with("/v1/") ? path.substr(4) : "other";
}

}  // namespace

struct Server::Impl::Front {
  struct Entry {
    Session* s;
    std::weak_ptr<Session> w;  // expired: the session is in its destructor, waiting for `mu`
  };
  using Queue = std::list<Entry>;  // pending connections, oldest first
  struct Peer {
    int pending = 0, established = 0;
    Queue queue;
  };
  std::mutex mu;
  std::map<net::ip::address, Peer> peers;
  Queue pending;
  int n_pending = 0, n_established = 0;
  // The oldest live connection of a pending queue, taken out of the books (under `mu`).
  static std::shared_ptr<Session> evict_oldest(Queue& q);
};

struct Server::Impl::Session : std::enable_shared_from_this<Session> {
  enum class Place { Pending, Established, Gone };

  Impl& im;
  beast::tcp_stream stream;
  net::steady_timer idle;  // the keep-alive wait
  beast::flat_buffer buf;
  std::optional<http::request_parser<http::string_body>> parser;
  const net::ip::address peer;
  // Guarded by the front's mutex.
  Place place = Place::Pending;
  bool listed = false;  // in the front's and its peer's pending queues
  Front::Queue::iterator in_pending, in_peer;
  // This connection's strand only.
  bool ended = false, waiting = false, keep = true;
  std::string out;  // an answer being written from here

  Session(Impl& i, tcp::socket s, net::ip::address p)
      : im(i), stream(std::move(s)), idle(stream.get_executor()), peer(std::move(p)) {}
  ~Session() { leave(); }

  // ---- bookkeeping (any thread) ----
  void gauges() {
    im.metrics.connections_pending = im.front->n_pending;
    im.metrics.connections_established = im.front->n_established;
  }
  // Under the front's mutex.
  void unlist(Front::Peer& p) {
    if (listed) {
      im.front->pending.erase(in_pending);
      p.queue.erase(in_peer);
    }
    listed = false;
  }
  void leave_locked() {
    Front& f = *im.front;
    if (place == Place::Gone) return;
    const auto it = f.peers.find(peer);
    Front::Peer& p = it->second;
    unlist(p);
    if (place == Place::Pending) {
      --f.n_pending, --p.pending;
    } else {
      --f.n_established, --p.established;
    }
    if (p.pending == 0 && p.established == 0) f.peers.erase(it);
    place = Place::Gone;
    gauges();
  }
  void leave() {
    std::lock_guard lk(im.front->mu);
    leave_locked();
  }
  // Past its first headers (and key): established, if there is room for it (else the cap).
  std::optional<Closed> graduate() {
    Front& f = *im.front;
    std::lock_guard lk(f.mu);
    if (place == Place::Established) return std::nullopt;
    if (place == Place::Gone) return Closed::Evicted;
    Front::Peer& p = f.peers.find(peer)->second;
    if (im.o.peer_connections_max > 0 && p.established >= im.o.peer_connections_max)
      return Closed::PeerCap;
    if (f.n_established >= im.o.max_connections) return Closed::TotalCap;
    unlist(p);
    --f.n_pending, --p.pending;
    ++f.n_established, ++p.established;
    place = Place::Established;
    gauges();
    return std::nullopt;
  }

  // ---- the connection (its strand) ----
  void start() { read_header(); }

  void read_header() {
    parser.emplace();
    parser->header_limit(64 * 1024);
    parser->body_limit(im.o.max_body);
    stream.expires_after(ms(im.o.header_timeout_s));
    http::async_read_header(
        stream, buf, *parser,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return read_failed(ec, Closed::HeaderTimeout);
    const auto& req = parser->get();
    const std::string_view target = sv(req.target());
    const Api api = target.starts_with("/v1/messages") ? Api::Anthropic : Api::OpenAI;
    if (auto e = im.check_headers(req))
      return answer_close(*e, Closed::Unauthorized, api, endpoint_of(target));
    if (auto cap = graduate()) {
      if (*cap == Closed::Evicted) return end();  // made way for a newer one meanwhile
      if (!reserved(target))
        return answer_close(
            {503, api == Api::Anthropic ? "overloaded_error" : "server_error",
             *cap == Closed::PeerCap
                 ? "too many connections from this address (expert-serve --peer-connections-max)"
                 : "too many connections (expert-serve --max-connections)"},
            *cap, api, endpoint_of(target));
      keep = false;  // answered from the reserve, then closed
    }
    if (parser->is_done()) return dispatch();
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      out = "HTTP/1.1 100 Continue\r\n\r\n";
      stream.expires_after(ms(im.o.write_timeout_s));
      return net::async_write(stream, net::buffer(out),
                              [self = shared_from_this()](beast::error_code ec, size_t) {
                                if (ec) return self->write_failed(ec);
                                self->read_body();
                              });
    }
    read_body();
  }

  void read_body() {
    stream.expires_after(ms(im.o.body_timeout_s));
    http::async_read(stream, buf, *parser,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->read_failed(ec, Closed::BodyTimeout);
                       self->dispatch();
                     });
  }

  void read_failed(beast::error_code ec, Closed timeout) {
    if (ec == beast::error::timeout) {  // tcp_stream has closed the socket
      im.metrics.count_closed(timeout);
      return end();
    }
    if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
        ec == net::error::eof || ec == net::error::connection_reset ||
        ec == net::error::operation_aborted || ended)
      return end();
    Closed why;
    HttpError e = im.parse_error(ec, why);
    answer_close(e, why, Api::OpenAI, "other");
  }

  void write_failed(beast::error_code ec) {
    if (ec == beast::error::timeout) im.metrics.count_closed(Closed::WriteTimeout);
    end();
  }

  // A request read whole: answered on a thread of its own.
  void dispatch() {
    stream.expires_never();
    const bool reserve = reserved(sv(parser->get().target()));
    const int limit = im.o.requests_max + (reserve ? kReservedRequests : 0);
    if (im.handlers.fetch_add(1) >= limit) {
      --im.handlers;
      return answer_close({503, "server_error",
                           "too many requests in progress (expert-serve --requests-max); retry"},
                          Closed::Busy, Api::OpenAI, endpoint_of(sv(parser->get().target())));
    }
    ++im.metrics.requests_active;
    auto req = std::make_shared<http::request<http::string_body>>(parser->release());
    parser.reset();
    try {
      std::thread([self = shared_from_this(), req]() mutable {
        Impl& im = self->im;
        Conn c(self->stream.socket().native_handle(), ms(im.o.write_timeout_s));
        // Draining: each answer closes its connection, so the client's next request goes to a new
        // one (and, behind a gateway, to another server).
        c.keep_alive = req->keep_alive() && self->keep && !im.draining;
        im.route(*req, c);
        if (c.timed_out) im.metrics.count_closed(Closed::WriteTimeout);
        const bool keep = c.keep_alive && !c.timed_out;
        req.reset();
        --im.metrics.requests_active;
        auto ex = self->stream.get_executor();
        net::post(ex, [self = std::move(self), keep] { self->after(keep); });
        --im.handlers;  // the last touch: stop() may go on once every handler is here
      }).detach();
    } catch (const std::system_error&) {  // no thread to be had
      --im.metrics.requests_active;
      --im.handlers;
      answer_close({503, "server_error", "cannot start a thread for the request; retry"},
                   Closed::Busy, Api::OpenAI, "other");
    }
  }

  // The answer is written: the next request, or the end.
  void after(bool keep_alive) {
    if (ended) return;
    if (!keep_alive || im.stopping || im.draining) return end();
    if (buf.size() > 0) return read_header();  // pipelined: already here
    buf.shrink_to_fit();                       // an idle connection holds no buffer
    waiting = true;
    idle.expires_after(ms(im.o.keepalive_s));
    idle.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->waiting) return;
      self->waiting = false;
      self->im.metrics.count_closed(Closed::Keepalive);
      self->end();
    });
    stream.socket().async_wait(tcp::socket::wait_read,
                               [self = shared_from_this()](beast::error_code ec) {
                                 if (!self->waiting) return;
                                 self->waiting = false;
                                 self->idle.cancel();
                                 if (ec) return self->end();
                                 self->read_header();
                               });
  }

  // An error answered from here, then the connection closed once the client has had the
  // chance to finish sending (closing on unread bytes would reset it before it read the answer).
  void answer_close(const HttpError& e, Closed why, Api api, const std::string& endpoint) {
    im.metrics.count_closed(why);
    im.metrics.count_request(endpoint, e.status);
    out.clear();
    Conn c(&out);
    c.keep_alive = false;
    std::vector<std::pair<std::string, std::string>> headers;
    if (e.status == 503) headers.emplace_back("Retry-After", "1");
    c.send(e.status, "application/json", error_body(api, e), headers);
    parser.reset();
    stream.expires_after(ms(im.o.write_timeout_s));
    net::async_write(stream, net::buffer(out),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->write_failed(ec);
                       beast::error_code ig;
                       self->stream.socket().shutdown(tcp::socket::shutdown_send, ig);
                       self->stream.expires_after(std::chrono::seconds(5));
                       self->drain();
                     });
  }

  void drain() {
    buf.clear();
    stream.async_read_some(buf.prepare(4096),
                           [self = shared_from_this()](beast::error_code ec, size_t) {
                             if (ec) return self->end();
                             self->drain();
                           });
  }

  void end() {
    if (ended) return;
    ended = true;
    waiting = false;
    idle.cancel();
    beast::error_code ig;
    stream.socket().shutdown(tcp::socket::shutdown_both, ig);
    stream.close();
    leave();
  }
};

Server::Impl::Impl(ServerOptions opts, Generator& s, const engine::Tokenizer& t, ModelChat c,
                   Metrics& m, Grammars& g)
    : o(std::move(opts)),
      sched(s),
      tok(t),
      chat(std::move(c)),
      metrics(m),
      grammars(g),
      front(std::make_unique<Front>()) {}

Server::Impl::~Impl() = default;

std::shared_ptr<Server::Impl::Session> Server::Impl::Front::evict_oldest(Queue& q) {
  while (!q.empty()) {
    auto e = q.front();
    if (auto s = e.w.lock()) {
      s->leave_locked();
      return s;
    }
    e.s->leave_locked();  // dying: counted out here (its own leave() then does nothing)
  }
  return nullptr;
}

void Server::Impl::admit(tcp::socket s) {
  beast::error_code ec;
  const auto ep = s.remote_endpoint(ec);
  if (ec) return;  // gone already
  s.set_option(tcp::no_delay(true), ec);
  std::shared_ptr<Session> session;
  std::vector<std::shared_ptr<Session>> evicted;
  {
    std::lock_guard lk(front->mu);
    Front& f = *front;
    // Room among the pending, first within the address's share, then in all: the oldest makes
    // way. A real client is past its headers in milliseconds; one that holds a place without
    // sending is the one to go, and one address cannot push out the others'.
    if (auto it = f.peers.find(ep.address()); it != f.peers.end() && o.peer_connections_max > 0 &&
                                              it->second.pending >= o.peer_connections_max)
      if (auto v = Front::evict_oldest(it->second.queue)) evicted.push_back(std::move(v));
    if (f.n_pending >= o.pending_connections_max)
      if (auto v = Front::evict_oldest(f.pending)) evicted.push_back(std::move(v));
    session = std::make_shared<Session>(*this, std::move(s), ep.address());
    Front::Peer& p = f.peers[ep.address()];
    ++p.pending, ++f.n_pending;
    session->in_pending = f.pending.insert(f.pending.end(), {session.get(), session});
    session->in_peer = p.queue.insert(p.queue.end(), {session.get(), session});
    session->listed = true;
    session->gauges();
  }
  for (auto& v : evicted) {
    metrics.count_closed(Closed::Evicted);
    net::post(v->stream.get_executor(), [v] { v->end(); });
  }
  net::post(session->stream.get_executor(), [session] { session->start(); });
}

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(io), [this](beast::error_code ec, tcp::socket s) {
    if (stopping || !acceptor.is_open()) return;
    if (ec) {  // EMFILE and the like: try again shortly
      accept_retry.expires_after(std::chrono::milliseconds(10));
      accept_retry.async_wait([this](beast::error_code) {
        if (!stopping) accept();
      });
      return;
    }
    admit(std::move(s));
    accept();
  });
}

Server::Server(ServerOptions o, Generator& sched, const engine::Tokenizer& tok, ModelChat chat,
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
  net::post(im.acceptor.get_executor(), [&im] { im.accept(); });
  std::vector<std::thread> more;
  for (int i = 1; i < im.o.io_threads; ++i) more.emplace_back([&im] { im.io.run(); });
  im.io.run();
  for (auto& t : more) t.join();
}

void Server::drain() {
  impl_->draining = true;
}

int Server::generations() const {
  return impl_->generations;
}

void Server::stop() {
  Impl& im = *impl_;
  if (im.stopping.exchange(true)) return;
  net::post(im.acceptor.get_executor(), [&im] {
    beast::error_code ig;
    im.acceptor.close(ig);
    im.accept_retry.cancel();
  });
  // Requests being answered see `stopping` within 50 ms and end (their writes have deadlines).
  for (int i = 0; i < 1500 && im.handlers > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  im.io.stop();
}

std::string Server::answer(std::string_view bytes) {
  Impl& im = *impl_;
  http::request_parser<http::string_body> p;
  p.header_limit(64 * 1024);
  p.body_limit(im.o.max_body);
  p.eager(true);
  std::string out;
  Conn c(&out);
  c.keep_alive = false;
  beast::error_code ec;
  size_t used = 0;
  while (used < bytes.size() && !p.is_done()) {
    const size_t n = p.put(net::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == http::error::need_more) {
      ec = {};
      if (n == 0) break;
      continue;
    }
    if (ec) break;
  }
  if (ec) {
    Closed why;
    const HttpError e = im.parse_error(ec, why);
    c.send_json(e.status, error_body(Api::OpenAI, e));
    return out;
  }
  if (!p.is_header_done()) return out;
  const Api api = sv(p.get().target()).starts_with("/v1/messages") ? Api::Anthropic : Api::OpenAI;
  if (auto e = im.check_headers(p.get())) {
    c.send_json(e->status, error_body(api, *e));
    return out;
  }
  if (!p.is_done()) return out;
  auto req = p.release();
  im.route(req, c);
  return out;
}

}  // namespace expertd::serve
