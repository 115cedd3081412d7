#include "daemon/server.h"

#include <grp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>

#include "daemon/popularity.h"
#include "proto/frame.h"

namespace expertd::daemon {

namespace {
constexpr size_t kWriteQueueMax = 1 << 16;  // frames queued to a client that does not read
constexpr uint32_t kNoPlace = ~0u;
using Clock = std::chrono::steady_clock;
}  // namespace

struct Server::Session {
  explicit Session(asio::io_context& ctx) : sock(ctx), hello_timer(ctx) {}
  asio::local::stream_protocol::socket sock;
  asio::steady_timer hello_timer;  // closes a connection that does not say Hello in time
  ClientId id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  bool hello = false, closed = false, close_after_write = false, writing = false;
  bool monitor = false, counted = false;  // counted: in per_uid_ (and pending_ until Hello)
  uint32_t place = kNoPlace;              // an engine's place on the residency board
  std::string name;                       // Hello's client_name, for the dashboards
  Clock::time_point connected = Clock::now();
  uint64_t acquires = 0;
  uint64_t draft_steps = 0, drafted = 0, accepted = 0;  // its DraftReports' sums
  uint8_t header[4];
  std::vector<uint8_t> body;
  struct Out {
    std::vector<uint8_t> bytes;
    std::vector<int> fds;  // passed with the first bytes
  };
  std::deque<Out> out;
};

Server::Server(asio::io_context& ctx, const Config& cfg, const pack::Manifest& m, SlotArena& arena,
               Cache& cache, IoEngine& io, TraceWriter& trace, Board* board)
    : ctx_(ctx),
      cfg_(cfg),
      m_(m),
      arena_(arena),
      cache_(cache),
      io_(io),
      trace_(trace),
      board_(board),
      places_(board ? board->places() : 0, false),
      acceptor_(ctx),
      io_event_(ctx, ::dup(io.event_fd())),
      timer_(ctx),
      what_if_(WhatIfShape{static_cast<uint32_t>(m.layers.size()), m.n_experts, arena.slot_count(),
                           arena.slot_bytes(), cfg.policy},
               [this] { asio::post(ctx_, [this] { what_if_done(); }); }),
      start_(Clock::now()),
      last_stats_(start_) {}

Server::~Server() = default;

Status Server::listen() {
  const std::string& path = cfg_.socket;
  if (auto slash = path.rfind('/'); slash != std::string::npos && slash > 0)
    ::mkdir(path.substr(0, slash).c_str(), 0750);  // RuntimeDirectory= makes it under systemd
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return make_error(path + " exists and is not a socket");
    // A socket nobody answers on is a leftover of a crashed daemon; a live one is a conflict.
    asio::local::stream_protocol::socket probe(ctx_);
    boost::system::error_code ec;
    probe.connect(asio::local::stream_protocol::endpoint(path), ec);
    if (!ec) return make_error(path + ": another expertd is serving on this socket");
    ::unlink(path.c_str());
  }
  boost::system::error_code ec;
  acceptor_.open(asio::local::stream_protocol(), ec);
  if (!ec) acceptor_.bind(asio::local::stream_protocol::endpoint(path), ec);
  if (!ec) acceptor_.listen(64, ec);
  if (ec) return make_error("listen on " + path + ": " + ec.message());
  ::fcntl(acceptor_.native_handle(), F_SETFD, FD_CLOEXEC);
  ::chmod(path.c_str(), 0660);
  if (!cfg_.socket_group.empty()) {
    struct group* g = ::getgrnam(cfg_.socket_group.c_str());
    if (!g) return make_error("--socket-group: no group named " + cfg_.socket_group);
    if (::chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0)
      return errno_error("chown " + path + " to group " + cfg_.socket_group);
  }
  return {};
}

void Server::start() {
  accept();
  watch_io();
  tick();
}

bool Server::peer_allowed(const Session& s) const {
  if (cfg_.allow_uid.empty() && cfg_.allow_gid.empty()) return true;
  auto in = [](const std::vector<uint32_t>& v, uint32_t x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  return in(cfg_.allow_uid, s.uid) || in(cfg_.allow_gid, s.gid);
}

// An error frame, then the connection closes (after the frame is written).
void Server::refuse(const std::shared_ptr<Session>& s, ErrorCode code, const std::string& why) {
  ++cache_.stats().c.clients_refused;
  spdlog::warn("refusing pid {} (uid {}): {}", s->pid, s->uid, why);
  send(s->id, proto::make_error_frame(0, code, why));
  s->close_after_write = true;
}

void Server::accept() {
  auto s = std::make_shared<Session>(ctx_);
  acceptor_.async_accept(s->sock, [this, s](boost::system::error_code ec) {
    if (ec) {
      if (ec != asio::error::operation_aborted && !stopping_) {
        spdlog::warn("accept: {}", ec.message());
        accept();
      }
      return;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(s->sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
      s->pid = cred.pid, s->uid = cred.uid, s->gid = cred.gid;
    s->id = next_client_++;
    sessions_[s->id] = s;
    const uint32_t uid_max = cfg_.uid_connections_max
                                 ? cfg_.uid_connections_max
                                 : cfg_.clients_max + cfg_.monitors_max + cfg_.pending_max;
    if (!peer_allowed(*s)) {
      refuse(s, ErrorCode::TooManyClients,
             "uid " + std::to_string(s->uid) + " (gid " + std::to_string(s->gid) +
                 ") is not allowed by --allow-uid/--allow-gid");
    } else if (pending_ >= cfg_.pending_max) {
      refuse(s, ErrorCode::TooManyClients,
             "expertd has " + std::to_string(pending_) +
                 " connections waiting to say Hello (--pending-max)");
    } else if (per_uid_[s->uid] >= uid_max) {
      refuse(s, ErrorCode::TooManyClients,
             "uid " + std::to_string(s->uid) + " holds " + std::to_string(per_uid_[s->uid]) +
                 " connections (--uid-connections-max " + std::to_string(uid_max) + ")");
    } else {
      s->counted = true;
      ++pending_;
      ++per_uid_[s->uid];
      ++cache_.stats().c.clients_connected_total;
      spdlog::debug("connection {} (pid {}, uid {})", s->id, s->pid, s->uid);
      s->hello_timer.expires_after(std::chrono::milliseconds(cfg_.hello_timeout_ms));
      s->hello_timer.async_wait([this, s](boost::system::error_code tec) {
        if (tec || s->hello || s->closed) return;
        ++cache_.stats().c.hello_timeouts;
        spdlog::warn("connection {} (pid {}, uid {}) did not say Hello within {} ms; closing",
                     s->id, s->pid, s->uid, cfg_.hello_timeout_ms);
        close(s);
      });
      read_header(s);
    }
    accept();
  });
}

void Server::read_header(std::shared_ptr<Session> s) {
  asio::async_read(
      s->sock, asio::buffer(s->header, 4), [this, s](boost::system::error_code ec, size_t) {
        if (ec) return close(s);
        uint32_t n = uint32_t(s->header[0]) | uint32_t(s->header[1]) << 8 |
                     uint32_t(s->header[2]) << 16 | uint32_t(s->header[3]) << 24;
        if (n == 0 || n > cfg_.frame_bytes_max) {
          ++cache_.stats().c.client_errors;
          spdlog::warn("client {}: frame of {} bytes (limit {}); closing", s->id, n,
                       cfg_.frame_bytes_max);
          send(s->id, proto::make_error_frame(0, ErrorCode::BadFrame,
                                              "frame of " + std::to_string(n) +
                                                  " bytes exceeds frame_bytes_max " +
                                                  std::to_string(cfg_.frame_bytes_max)));
          s->close_after_write = true;
          return;
        }
        s->body.resize(n);
        asio::async_read(s->sock, asio::buffer(s->body),
                         [this, s](boost::system::error_code ec2, size_t) {
                           if (ec2) return close(s);
                           handle(s);
                           if (!s->closed && !s->close_after_write) read_header(s);
                         });
      });
}

void Server::handle(const std::shared_ptr<Session>& s) {
  auto env = proto::verify_envelope(s->body);
  if (!env) {
    ++cache_.stats().c.client_errors;
    spdlog::warn("client {}: {}; closing", s->id, env.error().message);
    send(s->id, proto::make_error_frame(0, ErrorCode::BadFrame, env.error().message));
    s->close_after_write = true;
    return;
  }
  const wire::Envelope* e = *env;
  uint64_t rid = e->request_id();
  if (e->msg_type() == wire::Message::Hello) return handle_hello(s, rid, e->msg_as_Hello());
  if (!s->hello) {
    ++cache_.stats().c.client_errors;
    send(s->id,
         proto::make_error_frame(rid, ErrorCode::BadRequest, "the first message must be Hello"));
    s->close_after_write = true;
    return;
  }
  auto ids = [](const flatbuffers::Vector<uint32_t>* v) {
    return v ? std::span<const uint32_t>(v->data(), v->size()) : std::span<const uint32_t>();
  };
  const auto type = e->msg_type();
  cache_.drain_board();  // acquires engines served from the board count before this message
  if (s->monitor && (type == wire::Message::Acquire || type == wire::Message::Release ||
                     type == wire::Message::Prefetch || type == wire::Message::Done ||
                     type == wire::Message::DraftReport)) {
    ++cache_.stats().c.client_errors;
    return request_failed(s->id, rid, ErrorCode::BadRequest,
                          "a monitor connection does not acquire, release, prefetch or draft");
  }
  switch (type) {
    case wire::Message::Acquire: {
      auto* a = e->msg_as_Acquire();
      ++s->acquires;
      // The what-if ring takes what the cache would accept (a bad request would fail the replay).
      if (cache_.check_ids(a->layer(), ids(a->experts()), daemon::IdsFor::Acquire).first ==
          ErrorCode::None)
        what_if_.record(static_cast<uint32_t>(s->id), a->layer(), ids(a->experts()));
      if (trace_.enabled())
        trace_.record(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                Clock::now() - start_)
                                                .count()),
                      s->id, a->layer(), ids(a->experts()));
      return cache_.acquire(s->id, rid, a->layer(), ids(a->experts()));
    }
    case wire::Message::Release:
      return cache_.release(s->id, rid, e->msg_as_Release()->lease_id());
    case wire::Message::Done: {
      auto* d = e->msg_as_Done();
      return cache_.done(s->id, rid, d->lease_id(), ids(d->indices()));
    }
    case wire::Message::Prefetch: {
      auto* p = e->msg_as_Prefetch();
      auto [code, err] = cache_.check_ids(p->layer(), ids(p->experts()), daemon::IdsFor::Hint);
      if (code != ErrorCode::None) return request_failed(s->id, rid, code, err);
      if (p->will_acquire()) return cache_.announce(p->layer(), ids(p->experts()));
      if (trace_.enabled())
        trace_.record(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                Clock::now() - start_)
                                                .count()),
                      s->id, p->layer(), ids(p->experts()), /*hint=*/true);
      return cache_.prefetch(p->layer(), ids(p->experts()));
    }
    case wire::Message::DraftReport: {
      auto* d = e->msg_as_DraftReport();
      if (d->accepted() > d->drafted()) {
        ++cache_.stats().c.client_errors;
        return request_failed(s->id, rid, ErrorCode::BadRequest,
                              "a DraftReport accepted more drafts than it drafted");
      }
      auto& c = cache_.stats().c;
      c.draft_steps += d->steps(), c.draft_tokens += d->drafted(),
          c.draft_accepted += d->accepted();
      s->draft_steps += d->steps(), s->drafted += d->drafted(), s->accepted += d->accepted();
      return;
    }
    case wire::Message::StatsRequest: {
      flatbuffers::FlatBufferBuilder fbb(4096);
      std::vector<flatbuffers::Offset<wire::Metric>> ms;
      for (const auto& m : metrics())
        ms.push_back(wire::CreateMetricDirect(fbb, m.name.c_str(), m.unit.c_str(), m.help.c_str(),
                                              static_cast<uint8_t>(m.kind), m.value));
      return send(s->id, proto::make_frame(fbb, rid, wire::CreateStatsReplyDirect(fbb, &ms)));
    }
    case wire::Message::StatusRequest: {
      flatbuffers::FlatBufferBuilder fbb(4096);
      return send(s->id, proto::make_frame(
                             fbb, rid, wire::CreateStatusReplyDirect(fbb, status_json().c_str())));
    }
    case wire::Message::ExpertsRequest:
      return answer_experts(s->id, rid);
    case wire::Message::Admin: {
      auto* a = e->msg_as_Admin();
      if (a->op() == wire::AdminOp::ResetStats) {
        cache_.stats().reset(m_.layers.size(), m_.n_experts);
        io_.reset_high_water();
      } else if (a->op() == wire::AdminOp::EvictAll) {
        cache_.evict_all();
      } else {
        auto [code, err] = cache_.check_ids(a->layer(), ids(a->experts()), daemon::IdsFor::Hint);
        if (code != ErrorCode::None) return request_failed(s->id, rid, code, err);
        cache_.prefetch(a->layer(), ids(a->experts()));
      }
      flatbuffers::FlatBufferBuilder fbb(64);
      return send(s->id, proto::make_frame(fbb, rid, wire::CreateAck(fbb)));
    }
    default:
      ++cache_.stats().c.client_errors;
      return request_failed(s->id, rid, ErrorCode::BadRequest,
                            "message type not accepted by expertd");
  }
}

void Server::handle_hello(const std::shared_ptr<Session>& s, uint64_t rid, const wire::Hello* h) {
  if (s->hello) return request_failed(s->id, rid, ErrorCode::BadRequest, "Hello sent twice");
  s->hello_timer.cancel();
  if (h->protocol_version() != proto::kProtocolVersion) {
    send(s->id,
         proto::make_error_frame(rid, ErrorCode::VersionMismatch,
                                 "protocol version " + std::to_string(h->protocol_version()) +
                                     " is not supported (expertd speaks " +
                                     std::to_string(proto::kProtocolVersion) + ")"));
    s->close_after_write = true;
    return;
  }
  const bool monitor = h->kind() == wire::ClientKind::Monitor;
  if (!monitor && !h->reads_rows8() && m_.has_rows8())
    return refuse(s, ErrorCode::BadRequest,
                  "expertd's pack stores experts as interleaved rows (expert-pack build --layout "
                  "rows8), which this client does not read (" +
                      (h->client_name() ? h->client_name()->str() : std::string("?")) +
                      "): serve a pack built with --layout rows");
  if (!monitor && engines_ >= cfg_.clients_max)
    return refuse(s, ErrorCode::TooManyClients,
                  "expertd serves at most " + std::to_string(cfg_.clients_max) + " clients");
  if (monitor && monitors_ >= cfg_.monitors_max)
    return refuse(s, ErrorCode::TooManyClients,
                  "expertd serves at most " + std::to_string(cfg_.monitors_max) +
                      " monitor connections (--monitors-max)");
  s->monitor = monitor;
  if (!monitor && board_) {
    s->place =
        static_cast<uint32_t>(std::find(places_.begin(), places_.end(), false) - places_.begin());
    places_[s->place] = true;  // engines_ < clients_max = places: one is free
    cache_.attach(s->id, s->place);
  }
  --pending_;
  ++(monitor ? monitors_ : engines_);
  flatbuffers::FlatBufferBuilder fbb(16384);
  std::vector<flatbuffers::Offset<wire::LayerInfo>> layers;
  for (const auto& l : m_.layers) {
    std::vector<flatbuffers::Offset<wire::RoleInfo>> roles;
    for (const auto& r : l.roles)
      roles.push_back(wire::CreateRoleInfoDirect(
          fbb, std::string(pack::role_name(r.role)).c_str(), r.ggml_type, r.ne[0], r.ne[1],
          r.offset, r.bytes, r.layout == pack::Layout::Rows ? nullptr : "rows8"));
    layers.push_back(wire::CreateLayerInfoDirect(fbb, l.model_layer, l.stride, &roles));
  }
  const std::vector<uint8_t> mem_handle = arena_.ipc_memory_handle(),
                             event_handles = arena_.ipc_event_handles();
  auto reply = wire::CreateHelloReplyDirect(
      fbb, proto::kProtocolVersion, s->id, m_.model_id, m_.arch.c_str(), m_.n_experts,
      m_.n_experts_used, &layers,
      arena_.kind() == "cuda" ? wire::ArenaKind::Cuda : wire::ArenaKind::Host, arena_.slot_bytes(),
      arena_.slot_count(), cache_.max_experts_per_request(), arena_.arena_bytes(),
      mem_handle.empty() ? nullptr : &mem_handle, event_handles.empty() ? nullptr : &event_handles,
      arena_.cuda_pci_bus_id().empty() ? nullptr : arena_.cuda_pci_bus_id().c_str(),
      board_ && !monitor ? board_->board_bytes() : 0, board_ && !monitor ? board_->pins_bytes() : 0,
      s->place);
  s->hello = true;
  s->name = h->client_name() ? h->client_name()->str().substr(0, 128) : "";
  spdlog::debug("client {} is {} '{}'", s->id, monitor ? "a monitor" : "an engine",
                h->client_name() ? h->client_name()->str() : "");
  // An engine's reply carries the board's and the pins' memfds and the host arena's (SCM_RIGHTS);
  // a monitor maps nothing.
  std::vector<int> fds;
  if (!monitor && board_) fds = {board_->board_fd(), board_->pins_fd()};
  if (!monitor && arena_.share_fd() >= 0) fds.push_back(arena_.share_fd());
  send(s->id, proto::make_frame(fbb, rid, reply), std::move(fds));
}

void Server::send(ClientId c, std::vector<uint8_t> frame, std::vector<int> fds) {
  auto it = sessions_.find(c);
  if (it == sessions_.end()) return;
  auto s = it->second;
  if (s->closed) return;
  if (s->out.size() >= kWriteQueueMax) {
    spdlog::warn("client {} does not read its replies; closing", c);
    return close(s);
  }
  s->out.push_back({std::move(frame), std::move(fds)});
  if (s->writing) return;
  s->writing = true;
  write_front(s);
}

void Server::write_front(const std::shared_ptr<Session>& s) {
  if (s->closed) return;
  if (s->out.empty()) {
    s->writing = false;
    if (s->close_after_write) close(s);
    return;
  }
  Session::Out& o = s->out.front();
  if (!o.fds.empty()) {
    // The descriptor must ride on the frame's first bytes: a non-blocking sendmsg, and when the
    // client's buffer is full, wait until it is writable (never block the control thread).
    auto n = proto::send_some(s->sock.native_handle(), o.bytes, o.fds);
    if (!n) {
      spdlog::warn("client {}: {}", s->id, n.error().message);
      return close(s);
    }
    if (*n == 0) {
      s->sock.async_wait(asio::socket_base::wait_write, [this, s](boost::system::error_code ec) {
        if (ec) return close(s);
        write_front(s);
      });
      return;
    }
    o.bytes.erase(o.bytes.begin(), o.bytes.begin() + static_cast<std::ptrdiff_t>(*n));
    o.fds.clear();
    if (o.bytes.empty()) {
      s->out.pop_front();
      return write_front(s);
    }
  }
  asio::async_write(s->sock, asio::buffer(o.bytes),
                    [this, s](boost::system::error_code ec, size_t) {
                      if (ec) return close(s);
                      s->out.pop_front();
                      write_front(s);
                    });
}

void Server::close(const std::shared_ptr<Session>& s) {
  if (s->closed) return;
  s->closed = true;
  boost::system::error_code ec;
  s->hello_timer.cancel();
  s->sock.close(ec);
  if (s->counted) {
    if (!s->hello)
      --pending_;
    else
      --(s->monitor ? monitors_ : engines_);
    if (--per_uid_[s->uid] == 0) per_uid_.erase(s->uid);
  }
  if (s->id) {
    sessions_.erase(s->id);
    cache_.disconnect(s->id);  // its leases are released, its waiting acquire dropped
    if (s->place != kNoPlace) places_[s->place] = false;
    spdlog::debug("client {} disconnected", s->id);
  }
}

void Server::acquire_granted(ClientId c, uint64_t request_id, uint64_t lease_id,
                             std::span<const uint32_t> slots, std::span<const uint8_t> ready) {
  flatbuffers::FlatBufferBuilder fbb(128 + slots.size() * 8);
  auto sv = fbb.CreateVector(slots.data(), slots.size());
  auto rv = fbb.CreateVector(ready.data(), ready.size());
  send(c, proto::make_frame(fbb, request_id, wire::CreateAcquireReply(fbb, lease_id, sv, rv)));
}

void Server::expert_ready(ClientId c, uint64_t lease_id, uint32_t index, ErrorCode code,
                          const std::string& message, uint32_t slot) {
  flatbuffers::FlatBufferBuilder fbb(128);
  send(c, proto::make_frame(
              fbb, 0,
              wire::CreateReadyDirect(fbb, lease_id, index, code,
                                      message.empty() ? nullptr : message.c_str(), slot)));
}

void Server::board_acquired(ClientId c, uint32_t layer, std::span<const uint32_t> experts) {
  if (auto it = sessions_.find(c); it != sessions_.end()) ++it->second->acquires;
  what_if_.record(static_cast<uint32_t>(c), layer, experts);
  if (trace_.enabled())
    trace_.record(
        static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count()),
        c, layer, experts);
}

void Server::request_failed(ClientId c, uint64_t request_id, ErrorCode code,
                            const std::string& message) {
  send(c, proto::make_error_frame(request_id, code, message));
}

void Server::watch_io() {
  io_event_.async_wait(asio::posix::stream_descriptor::wait_read,
                       [this](boost::system::error_code ec) {
                         if (ec) return;
                         io_.reap();
                         watch_io();
                       });
}

std::vector<proto::Metric> Server::metrics() const {
  Gauges g = cache_.gauges();
  g.clients = engines_, g.monitors = monitors_, g.pending = pending_;
  g.uptime_s = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start_).count());
  return cache_.stats().to_metrics(g);
}

void Server::write_stats_file() {
  if (cfg_.stats_path.empty()) return;
  std::string tmp = cfg_.stats_path + ".tmp";
  {
    std::ofstream f(tmp);
    f << proto::render_json(metrics()) << "\n";
    if (!f) {
      spdlog::warn("cannot write stats file {}", tmp);
      return;
    }
  }
  std::rename(tmp.c_str(), cfg_.stats_path.c_str());
}

void Server::write_state_file() {
  if (cfg_.state_path.empty()) return;
  if (auto st = save_popularity(cfg_.state_path, m_, cache_.popularity()); !st)
    spdlog::warn("{}", st.error().message);
}

void Server::tick() {
  timer_.expires_after(std::chrono::milliseconds(100));
  timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    cache_.drain_board();
    cache_.expire_waiting();
    what_if_done(false);
    auto now = Clock::now();
    if (now - last_stats_ >= std::chrono::seconds(std::max(1u, cfg_.stats_interval_s))) {
      last_stats_ = now;
      write_stats_file();
      write_state_file();
      trace_.flush();
    }
    if (stopping_ && (io_.idle() || now > stop_deadline_)) {
      if (!io_.idle()) spdlog::warn("stopping with reads still in flight");
      trace_.flush();
      write_stats_file();
      write_state_file();
      ctx_.stop();
      return;
    }
    tick();
  });
}

void Server::shutdown() {
  if (stopping_) return;
  stopping_ = true;
  stop_deadline_ = Clock::now() + std::chrono::seconds(5);
  boost::system::error_code ec;
  acceptor_.close(ec);
  ::unlink(cfg_.socket.c_str());
  std::vector<std::shared_ptr<Session>> all;
  for (auto& [id, s] : sessions_) all.push_back(s);
  for (auto& s : all) close(s);
}

void Server::reopen_logs() {
  if (auto st = trace_.reopen(); !st) spdlog::error("{}", st.error().message);
}

void Server::answer_experts(ClientId c, uint64_t rid) {
  WhatIfResult w = what_if_.poll();
  // The first replay is on its way: wait for it (bounded: one place per connection).
  if (w.rows.empty() && what_if_.running() &&
      experts_waiting_.size() < cfg_.clients_max + cfg_.monitors_max) {
    experts_waiting_.push_back({c, rid, Clock::now()});
    return;
  }
  send(c, experts_frame(rid, w));
}

// all: the replay finished, everyone waiting is answered; else (the timer) those who waited 2 s,
// without it (a long ring on a big cache; the next snapshot has it).
void Server::what_if_done(bool all) {
  if (experts_waiting_.empty()) return;
  const WhatIfResult w = what_if_.poll();
  const auto now = Clock::now();
  std::erase_if(experts_waiting_, [&](const ExpertsWaiting& x) {
    if (!all && now - x.since < std::chrono::seconds(2)) return false;
    send(x.client, experts_frame(x.request_id, w));
    return true;
  });
}

std::vector<uint8_t> Server::experts_frame(uint64_t rid, const WhatIfResult& w) {
  cache_.drain_board();
  const Stats& st = cache_.stats();
  const size_t keys = m_.layers.size() * size_t{m_.n_experts};
  flatbuffers::FlatBufferBuilder fbb(4096 + keys * 17);
  std::vector<uint8_t> resident(keys);
  cache_.residency(resident);
  auto rv = fbb.CreateVector(resident);
  auto hv = fbb.CreateVector(st.expert_hits);
  auto mv = fbb.CreateVector(st.expert_misses);
  std::vector<uint32_t> model_layers;
  for (const auto& l : m_.layers) model_layers.push_back(l.model_layer);
  auto lv = fbb.CreateVector(model_layers);
  const auto now = Clock::now();
  const auto us = [](Clock::duration d) {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
  };
  std::vector<const Session*> connected;  // in the order they connected: a steady table
  for (const auto& [id, s] : sessions_)
    if (s->hello && !s->closed) connected.push_back(s.get());
  std::sort(connected.begin(), connected.end(),
            [](const Session* x, const Session* y) { return x->id < y->id; });
  std::vector<flatbuffers::Offset<wire::EngineInfo>> engines;
  for (const Session* s : connected) {
    engines.push_back(wire::CreateEngineInfoDirect(
        fbb, s->name.c_str(), s->pid,
        s->monitor ? wire::ClientKind::Monitor : wire::ClientKind::Engine, s->acquires,
        us(now - s->connected), s->draft_steps, s->drafted, s->accepted));
  }
  auto ev = fbb.CreateVector(engines);
  std::vector<flatbuffers::Offset<wire::WhatIfRow>> rows;
  for (const auto& r : w.rows)
    rows.push_back(wire::CreateWhatIfRow(fbb, r.slots, r.cache_mib, r.hit_rate));
  auto wv = fbb.CreateVector(rows);
  const bool cuda = arena_.kind() == "cuda";
  auto tiers = fbb.CreateString(!cuda ? "host" : arena_.host_slot_count() ? "vram+host" : "vram");
  auto policy = fbb.CreateString(cfg_.policy);
  // Measured once 100 ms of reads have passed: less says more about latency than bandwidth.
  const uint64_t busy_ns = io_.busy_ns();
  const double mib_s = busy_ns >= 100'000'000
                           ? double(io_.stats().bytes_done) / 1048576.0 / (double(busy_ns) / 1e9)
                           : -1.0;
  wire::ExpertsReplyBuilder b(fbb);
  b.add_t_us(us(now.time_since_epoch()));
  b.add_n_layers(static_cast<uint32_t>(m_.layers.size()));
  b.add_n_experts(m_.n_experts);
  b.add_tiers(tiers);
  b.add_residency(rv);
  b.add_hits(hv);
  b.add_misses(mv);
  b.add_model_layers(lv);
  b.add_engines(ev);
  b.add_read_bytes(st.c.pack_read_bytes);
  b.add_read_busy_us(busy_ns / 1000);
  b.add_read_mib_s(mib_s);
  b.add_slot_count(arena_.slot_count());
  b.add_slot_bytes(arena_.slot_bytes());
  b.add_host_slot_count(arena_.host_slot_count());
  b.add_policy(policy);
  b.add_what_if(wv);
  b.add_what_if_accesses(w.accesses);
  b.add_what_if_age_us(w.rows.empty() ? 0 : us(now - w.at));
  b.add_what_if_replay_us(static_cast<uint64_t>(w.replay_s * 1e6));
  return proto::make_frame(fbb, rid, b.Finish());
}

std::string Server::status_json() const {
  nlohmann::ordered_json j;
  j["version"] = "0.1.0";
  j["config"] = nlohmann::json::parse(cfg_.to_json());
  j["model"] = {{"arch", m_.arch},
                {"name", m_.model_name},
                {"model_id", pack::hex64(m_.model_id)},
                {"n_experts", m_.n_experts},
                {"n_experts_used", m_.n_experts_used},
                {"moe_layers", m_.moe_layers()},
                {"pack_bytes", m_.pack_bytes}};
  Gauges g = cache_.gauges();
  j["arena"] = {{"backend", arena_.kind()},
                {"slot_bytes", arena_.slot_bytes()},
                {"slot_count", arena_.slot_count()},
                {"arena_bytes", arena_.arena_bytes()},
                {"huge_page_bytes", arena_.huge_page_bytes()},
                {"slots_used", g.slots_used},
                {"slots_pinned", g.slots_pinned},
                {"max_experts_per_request", cache_.max_experts_per_request()}};
  j["clients"] = engines_;
  j["monitors"] = monitors_;
  j["pending"] = pending_;
  j["policy"] = cfg_.policy;
  return j.dump();
}

}  // namespace expertd::daemon
