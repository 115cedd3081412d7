#include "daemon/server.h"

#include <grp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>

#include "proto/frame.h"

namespace expertd::daemon {

namespace {
constexpr size_t kWriteQueueMax = 1 << 16;  // frames queued to a client that does not read
using Clock = std::chrono::steady_clock;
}  // namespace

struct Server::Session {
  explicit Session(asio::io_context& ctx) : sock(ctx) {}
  asio::local::stream_protocol::socket sock;
  ClientId id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  bool hello = false, closed = false, close_after_write = false, writing = false;
  uint8_t header[4];
  std::vector<uint8_t> body;
  std::deque<std::vector<uint8_t>> out;
};

Server::Server(asio::io_context& ctx, const Config& cfg, const pack::Manifest& m, SlotArena& arena,
               Cache& cache, IoEngine& io, TraceWriter& trace)
    : ctx_(ctx),
      cfg_(cfg),
      m_(m),
      arena_(arena),
      cache_(cache),
      io_(io),
      trace_(trace),
      acceptor_(ctx),
      io_event_(ctx, ::dup(io.event_fd())),
      timer_(ctx),
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
      s->pid = cred.pid, s->uid = cred.uid;
    if (sessions_.size() >= cfg_.clients_max) {
      spdlog::warn("refusing pid {}: {} clients already connected (--clients-max)", s->pid,
                   sessions_.size());
      auto f = proto::make_error_frame(
          0, ErrorCode::TooManyClients,
          "expertd serves at most " + std::to_string(cfg_.clients_max) + " clients");
      (void)proto::send_all(s->sock.native_handle(), f);
      boost::system::error_code ignored;
      s->sock.close(ignored);
    } else {
      s->id = next_client_++;
      sessions_[s->id] = s;
      ++cache_.stats().c.clients_connected_total;
      spdlog::debug("client {} connected (pid {}, uid {})", s->id, s->pid, s->uid);
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
  switch (e->msg_type()) {
    case wire::Message::Acquire: {
      auto* a = e->msg_as_Acquire();
      if (trace_.enabled())
        trace_.record(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                Clock::now() - start_)
                                                .count()),
                      s->id, a->layer(), ids(a->experts()));
      return cache_.acquire(s->id, rid, a->layer(), ids(a->experts()));
    }
    case wire::Message::Release:
      return cache_.release(s->id, rid, e->msg_as_Release()->lease_id());
    case wire::Message::Prefetch: {
      auto* p = e->msg_as_Prefetch();
      auto [code, err] = cache_.check_ids(p->layer(), ids(p->experts()), false);
      if (code != ErrorCode::None) return request_failed(s->id, rid, code, err);
      return cache_.prefetch(p->layer(), ids(p->experts()));
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
    case wire::Message::Admin: {
      auto* a = e->msg_as_Admin();
      if (a->op() == wire::AdminOp::ResetStats) {
        cache_.stats().reset(m_.layers.size());
        io_.reset_high_water();
      } else if (a->op() == wire::AdminOp::EvictAll) {
        cache_.evict_all();
      } else {
        auto [code, err] = cache_.check_ids(a->layer(), ids(a->experts()), false);
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
  if (h->protocol_version() != proto::kProtocolVersion) {
    send(s->id,
         proto::make_error_frame(rid, ErrorCode::VersionMismatch,
                                 "protocol version " + std::to_string(h->protocol_version()) +
                                     " is not supported (expertd speaks " +
                                     std::to_string(proto::kProtocolVersion) + ")"));
    s->close_after_write = true;
    return;
  }
  flatbuffers::FlatBufferBuilder fbb(16384);
  std::vector<flatbuffers::Offset<wire::LayerInfo>> layers;
  for (const auto& l : m_.layers) {
    std::vector<flatbuffers::Offset<wire::RoleInfo>> roles;
    for (const auto& r : l.roles)
      roles.push_back(wire::CreateRoleInfoDirect(fbb, std::string(pack::role_name(r.role)).c_str(),
                                                 r.ggml_type, r.ne[0], r.ne[1], r.offset, r.bytes));
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
      arena_.cuda_pci_bus_id().empty() ? nullptr : arena_.cuda_pci_bus_id().c_str());
  auto frame = proto::make_frame(fbb, rid, reply);
  s->hello = true;
  // The memfd rides along with the reply (SCM_RIGHTS); Hello is the first exchange, so nothing
  // else is queued and a direct send keeps the order.
  int fd = s->sock.native_handle();
  size_t sent = 0;
  while (sent < frame.size()) {
    Status st =
        proto::send_all(fd, std::span(frame).subspan(sent), sent == 0 ? arena_.share_fd() : -1);
    if (st) break;
    if (st.error().errno_value != EAGAIN) {
      spdlog::warn("client {}: hello reply: {}", s->id, st.error().message);
      return close(s);
    }
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, 1000);
  }
}

void Server::send(ClientId c, std::vector<uint8_t> frame) {
  auto it = sessions_.find(c);
  if (it == sessions_.end()) return;
  auto s = it->second;
  if (s->out.size() >= kWriteQueueMax) {
    spdlog::warn("client {} does not read its replies; closing", c);
    return close(s);
  }
  s->out.push_back(std::move(frame));
  if (s->writing) return;
  s->writing = true;
  auto write_next = std::make_shared<std::function<void()>>();
  *write_next = [this, s, write_next]() {
    asio::async_write(s->sock, asio::buffer(s->out.front()),
                      [this, s, write_next](boost::system::error_code ec, size_t) {
                        if (ec) {
                          s->writing = false;
                          return close(s);
                        }
                        s->out.pop_front();
                        if (!s->out.empty()) return (*write_next)();
                        s->writing = false;
                        if (s->close_after_write) close(s);
                      });
  };
  (*write_next)();
}

void Server::close(const std::shared_ptr<Session>& s) {
  if (s->closed) return;
  s->closed = true;
  boost::system::error_code ec;
  s->sock.close(ec);
  if (s->id) {
    sessions_.erase(s->id);
    cache_.disconnect(s->id);  // its leases are released, its waiting acquire dropped
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
                          const std::string& message) {
  flatbuffers::FlatBufferBuilder fbb(128);
  send(c, proto::make_frame(fbb, 0,
                            wire::CreateReadyDirect(fbb, lease_id, index, code,
                                                    message.empty() ? nullptr : message.c_str())));
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
  g.clients = sessions_.size();
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

void Server::tick() {
  timer_.expires_after(std::chrono::milliseconds(100));
  timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    cache_.expire_waiting();
    auto now = Clock::now();
    if (now - last_stats_ >= std::chrono::seconds(std::max(1u, cfg_.stats_interval_s))) {
      last_stats_ = now;
      write_stats_file();
      trace_.flush();
    }
    if (stopping_ && (io_.idle() || now > stop_deadline_)) {
      if (!io_.idle()) spdlog::warn("stopping with reads still in flight");
      trace_.flush();
      write_stats_file();
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
                {"slots_used", g.slots_used},
                {"slots_pinned", g.slots_pinned},
                {"max_experts_per_request", cache_.max_experts_per_request()}};
  j["clients"] = sessions_.size();
  j["policy"] = cfg_.policy;
  return j.dump();
}

}  // namespace expertd::daemon
