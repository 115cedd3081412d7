#include "client/expert_client.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/fd.h"
#include "common/shared_map.h"
#include "proto/board.h"
#include "proto/frame.h"

namespace expertd::client {

namespace wire = expertd::wire;

const RoleView* LayerView::find(const std::string& role) const {
  for (const auto& r : roles)
    if (r.role == role) return &r;
  return nullptr;
}

int ModelInfo::pack_layer_of(uint32_t model_layer) const {
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i].model_layer == model_layer) return static_cast<int>(i);
  return -1;
}

size_t Lease::pending() const {
  size_t n = 0;
  for (size_t i = 0; i < ready.size(); ++i) n += !ready[i] && errors[i].empty();
  return n;
}

size_t Lease::held() const {
  size_t n = 0;
  for (size_t i = 0; i < slots.size(); ++i) n += granted(i) && !done[i];
  return n;
}

namespace {
std::string error_text(const wire::Error* e) {
  return std::string("expertd: ") + wire::EnumNameErrorCode(e->code()) + ": " +
         (e->message() ? e->message()->str() : "");
}
}  // namespace

Result<std::unique_ptr<Client>> Client::connect(const std::string& socket_path, Options opts) {
  std::unique_ptr<Client> c(new Client());
  c->opts_ = opts;
  c->fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd_ < 0) return errno_error("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path)
    return make_error("socket path too long: " + socket_path);
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(c->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return errno_error("connect to expertd at " + socket_path);

  flatbuffers::FlatBufferBuilder fbb(256);
  uint64_t rid = c->next_request_++;
  // A daemon that refuses us (too many clients) writes its Error and closes at once; our Hello
  // may then fail, but the Error is still there to read and names the cause.
  Status sent = c->send(proto::make_frame(
      fbb, rid,
      wire::CreateHelloDirect(fbb, proto::kProtocolVersion, opts.name.c_str(),
                              opts.monitor ? wire::ClientKind::Monitor : wire::ClientKind::Engine,
                              opts.reads_rows8)));
  pollfd p{c->fd_, POLLIN, 0};
  if (!sent) {
    std::vector<uint8_t> body;
    if (::poll(&p, 1, 1000) > 0 && proto::recv_frame(c->fd_, body, 1 << 20))
      if (auto env = proto::verify_envelope(body); env && (*env)->msg_as_Error())
        return make_error(error_text((*env)->msg_as_Error()));
    return sent.error();
  }
  if (::poll(&p, 1, opts.timeout_ms) <= 0)
    return make_error("expertd at " + socket_path + " did not answer Hello");
  std::vector<uint8_t> body;
  std::vector<int> got_fds;
  Status got = proto::recv_frame(c->fd_, body, 64u << 20, &got_fds);
  std::vector<UniqueFd> fds;
  for (int f : got_fds) fds.emplace_back(f);
  EXPERTD_TRY(got);
  auto env = proto::verify_envelope(body);
  if (!env) return env.error();
  if (auto* e = (*env)->msg_as_Error()) return make_error(error_text(e));
  const wire::HelloReply* h = (*env)->msg_as_HelloReply();
  if (!h) return make_error("expertd answered Hello with an unexpected message");
  ModelInfo& i = c->info_;
  i.client_id = h->client_id();
  i.model_id = h->model_id();
  i.arch = h->arch() ? h->arch()->str() : "";
  i.n_experts = h->n_experts();
  i.n_experts_used = h->n_experts_used();
  i.arena_kind = h->arena_kind() == wire::ArenaKind::Cuda ? "cuda" : "host";
  i.slot_bytes = h->slot_bytes();
  i.slot_count = h->slot_count();
  i.arena_bytes = h->arena_bytes();
  i.max_experts_per_request = h->max_experts_per_request();
  if (h->cuda_ipc_handle())
    i.cuda_ipc_handle.assign(h->cuda_ipc_handle()->begin(), h->cuda_ipc_handle()->end());
  if (h->cuda_event_handles())
    i.cuda_event_handles.assign(h->cuda_event_handles()->begin(), h->cuda_event_handles()->end());
  if (h->cuda_pci_bus_id()) i.cuda_pci_bus_id = h->cuda_pci_bus_id()->str();
  if (h->layers())
    for (const auto* l : *h->layers()) {
      LayerView lv{l->model_layer(), l->stride(), {}};
      if (l->roles())
        for (const auto* r : *l->roles())
          lv.roles.push_back({r->role() ? r->role()->str() : "", r->ggml_type(), r->ne0(), r->ne1(),
                              r->offset(), r->bytes(), r->layout() ? r->layout()->str() : "rows"});
      i.layers.push_back(std::move(lv));
    }
  if (opts.monitor) return c;
  // Descriptors: the board's and the pins' (when the daemon keeps a board), then the host
  // arena's.
  auto sized = [&](int fd, uint64_t bytes, const char* what) -> Status {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes)
      return make_error(std::string("the ") + what + " descriptor is smaller than announced");
    return {};
  };
  size_t next_fd = 0;
  if (h->board_bytes() > 0) {
    if (fds.size() < 2) return make_error("expertd did not pass the board's descriptors");
    EXPERTD_TRY(sized(fds[0].get(), h->board_bytes(), "board"));
    EXPERTD_TRY(sized(fds[1].get(), h->pins_bytes(), "pins"));
    void* b = ::mmap(nullptr, h->board_bytes(), PROT_READ, MAP_SHARED, fds[0].get(), 0);
    if (b == MAP_FAILED) return errno_error("map the expertd board");
    c->board_ = static_cast<const uint8_t*>(b);
    c->board_bytes_ = h->board_bytes();
    void* p = ::mmap(nullptr, h->pins_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fds[1].get(), 0);
    if (p == MAP_FAILED) return errno_error("map the expertd pins");
    c->pins_map_ = static_cast<uint8_t*>(p);
    c->pins_bytes_ = h->pins_bytes();
    proto::board::Header bh;
    std::memcpy(&bh, c->board_, sizeof bh);
    if (bh.magic != proto::board::kMagic || bh.slot_count != i.slot_count ||
        bh.n_keys != i.layers.size() * i.n_experts || h->pin_place() >= bh.places ||
        proto::board::board_bytes(bh.n_keys, bh.slot_count) > c->board_bytes_ ||
        proto::board::pins_bytes(bh.places, bh.pins_per_place) > c->pins_bytes_)
      return make_error("expertd's residency board does not match its HelloReply");
    c->board_keys_ = bh.n_keys;
    c->pins_per_place_ = bh.pins_per_place;
    c->place_ =
        c->pins_map_ + size_t{h->pin_place()} * proto::board::place_bytes(bh.pins_per_place);
    next_fd = 2;
  }
  if (i.arena_kind == "host") {
    if (fds.size() <= next_fd) return make_error("expertd did not pass the arena descriptor");
    const int arena_fd = fds[next_fd].get();
    EXPERTD_TRY(sized(arena_fd, i.arena_bytes, "arena"));
    auto m = map_shared_aligned(arena_fd, i.arena_bytes, PROT_READ, true);
    if (!m) return make_error("map the expertd arena: " + m.error().message);
    c->arena_ = static_cast<const uint8_t*>(*m);
  }
  return c;
}

Client::~Client() {
  if (arena_) ::munmap(const_cast<uint8_t*>(arena_), info_.arena_bytes);
  if (board_) ::munmap(const_cast<uint8_t*>(board_), board_bytes_);
  if (pins_map_) ::munmap(pins_map_, pins_bytes_);  // the daemon clears our pins as we go
  if (fd_ >= 0) ::close(fd_);
}

// Once the connection breaks, every later call fails with the first cause, so whichever call
// reports it, the user reads why (a closed daemon, a timeout), not only that it broke.
Status Client::broken_error() const {
  return make_error("the connection to expertd is broken: " + broken_why_);
}

Status Client::fail(Status st) {
  broken_ = true;
  broken_why_ = st.error().message;
  return st;
}

Status Client::send(const std::vector<uint8_t>& frame) {
  if (broken_) return broken_error();
  Status st = proto::send_all(fd_, frame);
  return st ? st : fail(std::move(st));
}

Status Client::read_frame(std::vector<uint8_t>& body) {
  if (broken_) return broken_error();
  pollfd p{fd_, POLLIN, 0};
  int rc;
  do rc = ::poll(&p, 1, opts_.timeout_ms);
  while (rc < 0 && errno == EINTR);
  if (rc == 0)
    return fail(
        make_error("expertd did not answer within " + std::to_string(opts_.timeout_ms) + " ms"));
  Status st = proto::recv_frame(fd_, body, 64u << 20);
  return st ? st : fail(std::move(st));
}

// Reads one frame. Ready messages of the current lease are applied (or kept for later); replies
// are stashed for await_reply. Returns the lease index that became ready, or -1.
Status Client::pump_one(Lease* lease) {
  std::vector<uint8_t> body;
  EXPERTD_TRY(read_frame(body));
  auto env = proto::verify_envelope(body);
  if (!env) return env.error();
  const wire::Envelope* e = *env;
  if (auto* r = e->msg_as_Ready()) {
    if (r->lease_id() != current_lease_) return {};  // a lease released meanwhile
    EarlyReady er{r->index(),
                  r->error() == wire::ErrorCode::None
                      ? ""
                      : std::string(wire::EnumNameErrorCode(r->error())) + ": " +
                            (r->message() ? r->message()->str() : ""),
                  r->slot()};
    if (er.slot != proto::kNoSlot && er.slot >= info_.slot_count)
      return fail(
          make_error("expertd named slot " + std::to_string(er.slot) + " beyond the arena"));
    if (lease && lease->id == r->lease_id())
      apply(*lease, er);
    else
      early_ready_.push_back(std::move(er));
    return {};
  }
  if (auto* er = e->msg_as_Error(); er && e->request_id() == 0) return make_error(error_text(er));
  stashed_.push_back(std::move(body));
  return {};
}

Result<std::vector<uint8_t>> Client::await_reply(uint64_t rid) {
  for (;;) {
    for (auto it = stashed_.begin(); it != stashed_.end(); ++it) {
      const auto* e = wire::GetEnvelope(it->data());
      if (e->request_id() == rid) {
        auto body = std::move(*it);
        stashed_.erase(it);
        return body;
      }
    }
    // Errors of fire-and-forget messages are kept aside, not mistaken for this reply.
    for (auto it = stashed_.begin(); it != stashed_.end();) {
      const auto* e = wire::GetEnvelope(it->data());
      if (e->msg_as_Error() && e->request_id() < rid) {
        async_error_ = error_text(e->msg_as_Error());
        it = stashed_.erase(it);
      } else {
        ++it;
      }
    }
    EXPERTD_TRY(pump_one(nullptr));
  }
}

Result<std::vector<uint8_t>> Client::round_trip(uint64_t rid, const std::vector<uint8_t>& frame) {
  EXPERTD_TRY(send(frame));
  auto body = await_reply(rid);
  if (!body) return body.error();
  if (auto* er = wire::GetEnvelope(body->data())->msg_as_Error()) return make_error(error_text(er));
  return body;
}

void Client::unpin_board(size_t n) {
  for (size_t i = 0; i < n; ++i)
    proto::board::at<uint32_t>(place_, proto::board::pins_offset() + i * 4)
        .store(0, std::memory_order_release);
}

bool Client::pin_from_board(uint32_t layer, std::span<const uint32_t> experts, Lease& l) {
  namespace b = proto::board;
  const size_t n = experts.size();
  if (!board_ || !opts_.use_board || n == 0 || n > pins_per_place_ || layer >= info_.layers.size())
    return false;
  for (size_t i = 0; i < n; ++i) {  // what the daemon would refuse, it refuses by name
    if (experts[i] >= info_.n_experts) return false;
    for (size_t j = 0; j < i; ++j)
      if (experts[j] == experts[i]) return false;
  }
  // Room in the ring for this acquire's record, or the socket (the daemon drains it soon).
  auto head_ref = b::at<uint64_t>(place_, 0);
  const uint64_t head = head_ref.load(std::memory_order_relaxed);
  const uint64_t tail = b::at<uint64_t>(place_, 8).load(std::memory_order_acquire);
  if (head - tail + 1 + n > b::kRingWords) return false;
  l.slots.resize(n);
  const size_t words = b::word_offset(board_keys_);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t key = layer * info_.n_experts + experts[i];
    const uint32_t v = b::at<uint32_t>(board_, b::slot_of_offset() + size_t{key} * 4)
                           .load(std::memory_order_acquire);
    bool ok = v != 0 && v <= info_.slot_count;
    if (ok) {
      auto w = b::at<uint64_t>(board_, words + size_t{v - 1} * 8);
      const uint64_t seen = w.load(std::memory_order_acquire);
      ok = static_cast<uint32_t>(seen) == key + 1;
      if (ok) {
        // Pin, then look again: the daemon withdraws a slot before it looks at the pins.
        b::at<uint32_t>(place_, b::pins_offset() + i * 4).store(v, std::memory_order_seq_cst);
        ok = w.load(std::memory_order_seq_cst) == seen;
        if (!ok) unpin_board(i + 1);
      }
    }
    if (!ok) {
      unpin_board(i);
      return false;
    }
    l.slots[i] = v - 1;
  }
  // The record the daemon counts as this acquire.
  auto ring = [&](uint64_t pos, uint32_t word) {
    b::at<uint32_t>(place_, b::ring_offset(pins_per_place_) + size_t{pos % b::kRingWords} * 4)
        .store(word, std::memory_order_relaxed);
  };
  ring(head, layer << 16 | static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) ring(head + 1 + i, experts[i]);
  head_ref.store(head + 1 + n, std::memory_order_release);
  l.id = (uint64_t{1} << 63) | ++board_leases_;
  l.layer = layer;
  l.experts.assign(experts.begin(), experts.end());
  l.ready.assign(n, 1);
  l.errors.assign(n, "");
  l.done.assign(n, 0);
  l.reported.assign(n, 1);
  l.base = arena_;
  l.slot_bytes = info_.slot_bytes;
  l.from_board = true;
  return true;
}

Result<Lease> Client::acquire(uint32_t layer, std::span<const uint32_t> experts) {
  if (broken_) return broken_error().error();
  if (current_lease_ != 0)
    return make_error(
        "expertd: BadRequest: this client already holds or awaits a lease; release it before "
        "the next acquire");
  // The board pins without a message, so first a look (no wait) at whether the daemon hung up:
  // a dead daemon is this call's error, not the next round trip's.
  if (pollfd p{fd_, POLLRDHUP, 0};
      ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)))
    return fail(make_error("expertd closed the connection")).error();
  if (Lease l; pin_from_board(layer, experts, l)) {
    current_lease_ = l.id;
    return l;
  }
  flatbuffers::FlatBufferBuilder fbb(64 + experts.size() * 4);
  uint64_t rid = next_request_++;
  auto ids = fbb.CreateVector(experts.data(), experts.size());
  auto body = round_trip(rid, proto::make_frame(fbb, rid, wire::CreateAcquire(fbb, layer, ids)));
  if (!body) return body.error();
  const auto* r = wire::GetEnvelope(body->data())->msg_as_AcquireReply();
  if (!r || !r->slots() || !r->ready() || r->slots()->size() != experts.size() ||
      r->ready()->size() != experts.size())
    return make_error("expertd sent a malformed acquire reply");
  Lease l;
  l.id = r->lease_id();
  l.layer = layer;
  l.experts.assign(experts.begin(), experts.end());
  l.slots.assign(r->slots()->begin(), r->slots()->end());
  l.ready.assign(r->ready()->begin(), r->ready()->end());
  l.errors.assign(experts.size(), "");
  l.done.assign(experts.size(), 0);
  l.reported = l.ready;  // ready in the reply: the caller sees them there
  l.base = arena_;
  l.slot_bytes = info_.slot_bytes;
  for (uint32_t s : l.slots)
    if (s >= info_.slot_count && s != proto::kNoSlot)
      return make_error("expertd named slot " + std::to_string(s) + " beyond the arena");
  current_lease_ = l.id;
  for (const auto& er : early_ready_) apply(l, er);
  early_ready_.clear();
  return l;
}

void Client::apply(Lease& l, const EarlyReady& r) const {
  if (r.index >= l.ready.size()) return;
  if (r.slot != proto::kNoSlot) l.slots[r.index] = r.slot;
  if (r.error.empty())
    l.ready[r.index] = 1;
  else
    l.errors[r.index] = r.error;
}

// Each expert that became ready (or failed) since the reply once, even when several came in one
// read: up to `max` of them appended to `out`.
void Client::collect(Lease& lease, std::vector<size_t>& out, size_t max) {
  for (const auto& er : early_ready_) apply(lease, er);
  early_ready_.clear();
  for (size_t i = 0; i < lease.ready.size() && out.size() < max; ++i)
    if ((lease.ready[i] || !lease.errors[i].empty()) && !lease.reported[i]) {
      lease.reported[i] = 1;
      out.push_back(i);
    }
}

Result<std::optional<size_t>> Client::next_ready(Lease& lease) {
  std::vector<size_t> one;
  for (;;) {
    collect(lease, one, 1);
    if (!one.empty()) return std::optional<size_t>(one[0]);
    if (lease.pending() == 0) return std::optional<size_t>();
    // Nothing granted is still loading and the lease holds its whole pin budget: the next wave
    // comes only after done().
    bool in_flight = false;
    for (size_t i = 0; i < lease.ready.size(); ++i)
      in_flight |= lease.granted(i) && !lease.ready[i] && lease.errors[i].empty();
    if (!in_flight && lease.held() >= info_.max_experts_per_request)
      return make_error(
          "the lease holds " + std::to_string(lease.held()) +
          " experts, expertd's pin budget (max_experts_per_request): hand back used ones with "
          "done() before waiting for the next wave");
    EXPERTD_TRY(pump_one(&lease));
  }
}

Result<std::vector<size_t>> Client::ready_batch(Lease& lease) {
  std::vector<size_t> out;
  auto first = next_ready(lease);
  if (!first) return first.error();
  if (!first->has_value()) return out;
  out.push_back(**first);
  // What else has arrived already, without waiting: one batch for the backend.
  for (;;) {
    collect(lease, out, lease.ready.size());
    pollfd p{fd_, POLLIN, 0};
    if (lease.pending() == 0 || ::poll(&p, 1, 0) <= 0) return out;
    EXPERTD_TRY(pump_one(&lease));
  }
}

Status Client::done(Lease& lease, std::span<const size_t> indices) {
  if (lease.id == 0 || lease.from_board || indices.empty()) return {};
  std::vector<uint32_t> idx;
  for (size_t i : indices) {
    if (i >= lease.slots.size() || !lease.granted(i) || lease.done[i] || !lease.ready[i])
      return make_error("done(): expert index " + std::to_string(i) +
                        " is not a ready, held expert of the lease");
    idx.push_back(static_cast<uint32_t>(i));
  }
  for (uint32_t i : idx) lease.done[i] = 1;
  flatbuffers::FlatBufferBuilder fbb(64 + idx.size() * 4);
  auto v = fbb.CreateVector(idx);
  return send(proto::make_frame(fbb, next_request_++, wire::CreateDone(fbb, lease.id, v)));
}

Status Client::wait_ready(Lease& lease, std::optional<size_t> index) {
  for (;;) {
    if (index) {
      if (!lease.errors[*index].empty())
        return make_error("expert " + std::to_string(lease.experts[*index]) + ": " +
                          lease.errors[*index]);
      if (lease.ready[*index]) return {};
    } else {
      for (size_t i = 0; i < lease.errors.size(); ++i)
        if (!lease.errors[i].empty())
          return make_error("expert " + std::to_string(lease.experts[i]) + ": " + lease.errors[i]);
      if (lease.pending() == 0) return {};
    }
    auto r = next_ready(lease);
    if (!r) return r.error();
  }
}

Status Client::release(Lease& lease) {
  if (lease.id == 0) return {};
  if (lease.from_board) {
    unpin_board(lease.experts.size());
    if (current_lease_ == lease.id) current_lease_ = 0;
    lease.id = 0;
    return {};
  }
  flatbuffers::FlatBufferBuilder fbb(64);
  uint64_t rid = next_request_++;
  Status st = send(proto::make_frame(fbb, rid, wire::CreateRelease(fbb, lease.id)));
  if (current_lease_ == lease.id) current_lease_ = 0;
  early_ready_.clear();
  lease.id = 0;
  return st;
}

Status Client::prefetch(uint32_t layer, std::span<const uint32_t> experts, bool will_acquire) {
  flatbuffers::FlatBufferBuilder fbb(64 + experts.size() * 4);
  auto ids = fbb.CreateVector(experts.data(), experts.size());
  return send(
      proto::make_frame(fbb, next_request_++, wire::CreatePrefetch(fbb, layer, ids, will_acquire)));
}

Status Client::report_drafts(uint64_t steps, uint64_t drafted, uint64_t accepted) {
  flatbuffers::FlatBufferBuilder fbb(64);
  return send(proto::make_frame(fbb, next_request_++,
                                wire::CreateDraftReport(fbb, steps, drafted, accepted)));
}

Result<std::vector<proto::Metric>> Client::stats() {
  flatbuffers::FlatBufferBuilder fbb(64);
  uint64_t rid = next_request_++;
  auto body = round_trip(rid, proto::make_frame(fbb, rid, wire::CreateStatsRequest(fbb)));
  if (!body) return body.error();
  const auto* r = wire::GetEnvelope(body->data())->msg_as_StatsReply();
  if (!r) return make_error("expertd sent an unexpected reply to Stats");
  std::vector<proto::Metric> out;
  if (r->metrics())
    for (const auto* m : *r->metrics())
      out.push_back({m->name() ? m->name()->str() : "", m->unit() ? m->unit()->str() : "",
                     m->help() ? m->help()->str() : "", static_cast<proto::MetricKind>(m->kind()),
                     m->value()});
  return out;
}

Result<std::string> Client::status_json() {
  flatbuffers::FlatBufferBuilder fbb(64);
  uint64_t rid = next_request_++;
  auto body = round_trip(rid, proto::make_frame(fbb, rid, wire::CreateStatusRequest(fbb)));
  if (!body) return body.error();
  const auto* r = wire::GetEnvelope(body->data())->msg_as_StatusReply();
  if (!r || !r->json()) return make_error("expertd sent an unexpected reply to Status");
  return r->json()->str();
}

Status Client::admin(AdminOp op, uint32_t layer, std::span<const uint32_t> experts) {
  flatbuffers::FlatBufferBuilder fbb(64 + experts.size() * 4);
  uint64_t rid = next_request_++;
  auto ids = fbb.CreateVector(experts.data(), experts.size());
  auto wop = op == AdminOp::ResetStats ? wire::AdminOp::ResetStats
             : op == AdminOp::EvictAll ? wire::AdminOp::EvictAll
                                       : wire::AdminOp::Warmup;
  auto body = round_trip(rid, proto::make_frame(fbb, rid, wire::CreateAdmin(fbb, wop, layer, ids)));
  if (!body) return body.error();
  return {};
}

std::optional<std::string> Client::take_async_error() {
  return std::exchange(async_error_, std::nullopt);
}

}  // namespace expertd::client
