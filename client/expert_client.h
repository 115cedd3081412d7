// libexpertclient: an engine's connection to expertd. Connects, handshakes, maps the slot arena
// read-only, and acquires experts per layer: the reply comes at once with the ready experts
// (hits); the misses become ready one by one while the engine computes the hits.
// Blocking and single-threaded per Client; no Boost in this header.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "proto/metrics.h"

namespace expertd::client {

struct RoleView {
  std::string role;  // gate, up, gate_up, down, gate_bias, up_bias, gate_up_bias, down_bias
  uint32_t ggml_type = 0;
  uint64_t ne0 = 0, ne1 = 0, offset = 0, bytes = 0;
  // "rows" (as the GGUF stores them) or "rows8" (interleaved eight rows at a time, kernels'
  // rows8_pack: only for a client connected with Options::reads_rows8)
  std::string layout = "rows";
};

struct LayerView {
  uint32_t model_layer = 0;
  uint64_t stride = 0;
  std::vector<RoleView> roles;
  const RoleView* find(const std::string& role) const;
};

struct ModelInfo {
  uint32_t client_id = 0;
  uint64_t model_id = 0;
  std::string arch;
  uint32_t n_experts = 0, n_experts_used = 0;
  std::vector<LayerView> layers;  // index = pack layer
  std::string arena_kind;         // "host" or "cuda"
  uint64_t slot_bytes = 0, arena_bytes = 0;
  uint32_t slot_count = 0, max_experts_per_request = 0;
  // cuda arena: cudaIpcMemHandle_t of the slots, one cudaIpcEventHandle_t per slot (see
  // cuda_slots.h).
  std::vector<uint8_t> cuda_ipc_handle, cuda_event_handles;
  std::string cuda_pci_bus_id;                    // the GPU holding the arena
  int pack_layer_of(uint32_t model_layer) const;  // -1 for a dense layer
};

struct Lease {
  uint64_t id = 0;
  uint32_t layer = 0;
  std::vector<uint32_t> experts;
  // proto::kNoSlot for an expert of a later wave (an acquire of more than
  // max_experts_per_request): its slot comes with its Ready, after done() handed back others.
  std::vector<uint32_t> slots;
  std::vector<uint8_t> ready;       // 1: the slot may be read
  std::vector<uint8_t> done;        // 1: handed back with done()
  std::vector<uint8_t> reported;    // 1: ready in the reply, or returned by next_ready
  std::vector<std::string> errors;  // non-empty: this expert failed to load
  const uint8_t* base = nullptr;    // host arena mapping (null for a cuda arena: see CudaSlots)
  uint64_t slot_bytes = 0;
  bool from_board = false;  // every expert pinned from the residency board: no round trip
  size_t pending() const;
  bool granted(size_t i) const { return slots[i] != 0xffffffffu; }
  size_t held() const;  // granted and not done: what the daemon pins for this lease
  const uint8_t* slot_data(size_t i) const { return base + uint64_t{slots[i]} * slot_bytes; }
};

enum class AdminOp { ResetStats, EvictAll, Warmup };

class Client {
 public:
  struct Options {
    std::string name = "expertclient";
    int timeout_ms = 120000;  // a reply that does not come in this time is an error, never a hang
    // A monitor (expertctl): stats, status and admin verbs only; it takes no engine place, maps
    // no arena and cannot acquire.
    bool monitor = false;
    // Pin experts the residency board shows ready without a round trip (proto/board.h); false
    // sends every acquire through the socket (to measure one against the other).
    bool use_board = true;
    // This engine reads roles stored interleaved (RoleView::layout "rows8"); without it, a
    // daemon whose pack has such roles refuses the connection, naming the cause.
    bool reads_rows8 = false;
  };
  static Result<std::unique_ptr<Client>> connect(const std::string& socket_path, Options opts);
  static Result<std::unique_ptr<Client>> connect(const std::string& socket_path) {
    return connect(socket_path, Options{});
  }
  ~Client();

  const ModelInfo& info() const { return info_; }
  const uint8_t* arena() const { return arena_; }

  // When every expert is ready on the residency board (and they fit one pin budget), they are
  // pinned there and the lease comes back without a message to the daemon; otherwise the daemon
  // grants it.
  Result<Lease> acquire(uint32_t layer, std::span<const uint32_t> experts);
  // Blocks until expert `index` (or, with nullopt, every expert) of the lease is ready.
  Status wait_ready(Lease& lease, std::optional<size_t> index = std::nullopt);
  // Blocks until one more expert becomes ready; returns its index, or nullopt when none is pending.
  // An error, not a hang, when the lease's next wave can only come after done().
  Result<std::optional<size_t>> next_ready(Lease& lease);
  // As next_ready, then every other expert whose Ready has arrived already (no waiting): the
  // backend computes them as one batch. Empty when none is pending.
  Result<std::vector<size_t>> ready_batch(Lease& lease);
  // The engine is finished with these experts of the lease (ready ones): their pins go and the
  // daemon grants the lease's next wave. One-way.
  Status done(Lease& lease, std::span<const size_t> indices);
  Status release(Lease& lease);
  // A hint (the daemon may read them if it judges them worth a slot), or with will_acquire the
  // rest of a layer this client acquires next, in further requests: read at demand priority.
  Status prefetch(uint32_t layer, std::span<const uint32_t> experts, bool will_acquire = false);
  // Speculative decoding's counts since the last report (one-way): the daemon sums them per
  // engine and in total (expertctl stats: draft_tokens, draft_accepted, draft_acceptance). A
  // daemon older than the message answers an error, kept as take_async_error's.
  Status report_drafts(uint64_t steps, uint64_t drafted, uint64_t accepted);
  Result<std::vector<proto::Metric>> stats();
  Result<std::string> status_json();
  // The cache per expert as one JSON document (docs/expertctl.md has its keys): residency and
  // cumulative hits and misses per (layer, expert), the connections, the drive, and what other
  // cache sizes would have given. Consumers diff successive documents for recent activity.
  Result<std::string> experts_json();
  Status admin(AdminOp op, uint32_t layer = 0, std::span<const uint32_t> experts = {});
  // An error the daemon sent for a fire-and-forget message (release, prefetch), if any.
  std::optional<std::string> take_async_error();
  // The connection failed (the daemon closed it, died or stopped answering): every later call
  // fails; an engine reconnects with a new Client.
  bool broken() const { return broken_; }

 private:
  Client() = default;
  struct Impl;
  Status send(const std::vector<uint8_t>& frame);
  Result<std::vector<uint8_t>> await_reply(uint64_t request_id);  // the reply's frame body
  // Sends a request and waits for its reply; an Error reply becomes an error naming the cause.
  Result<std::vector<uint8_t>> round_trip(uint64_t request_id, const std::vector<uint8_t>& frame);
  Status pump_one(Lease* lease);  // reads one frame; applies Ready to `lease`
  Status read_frame(std::vector<uint8_t>& body);
  Status broken_error() const;
  Status fail(Status st);  // marks the connection broken, keeping why
  // Pins every expert from the board, or none (false): the acquire goes through the socket.
  bool pin_from_board(uint32_t layer, std::span<const uint32_t> experts, Lease& l);
  void unpin_board(size_t n);

  int fd_ = -1;
  Options opts_;
  ModelInfo info_;
  const uint8_t* arena_ = nullptr;
  const uint8_t* board_ = nullptr;  // read-only
  uint8_t* place_ = nullptr;        // this engine's pins and ring
  uint64_t board_bytes_ = 0, pins_bytes_ = 0;
  uint8_t* pins_map_ = nullptr;
  uint32_t board_keys_ = 0, pins_per_place_ = 0;
  uint64_t board_leases_ = 0;
  uint64_t next_request_ = 1;
  uint64_t current_lease_ = 0;
  std::vector<std::vector<uint8_t>> stashed_;  // replies read while waiting for something else
  struct EarlyReady {
    uint32_t index;
    std::string error;
    uint32_t slot;
  };
  std::vector<EarlyReady> early_ready_;  // Ready of the current lease seen before its reply
  void apply(Lease& l, const EarlyReady& r) const;
  void collect(Lease& lease, std::vector<size_t>& out, size_t max);
  std::optional<std::string> async_error_;
  bool broken_ = false;
  std::string broken_why_;  // what broke it, repeated by every later call
};

}  // namespace expertd::client
