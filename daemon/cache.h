// The expert cache: slot table (FREE -> LOADING -> READY), leases that pin slots (leases.h), joined
// waiters, FIFO waiting when slots are short, prefetch, and eviction through a policy.
// Runs on the control thread only: no locks. It talks to clients through CacheSink.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/affinity.h"
#include "daemon/arena.h"
#include "daemon/board.h"
#include "daemon/host_tier.h"
#include "daemon/io_engine.h"
#include "daemon/leases.h"
#include "daemon/policy.h"
#include "daemon/stats.h"
#include "proto/expertd_generated.h"
#include "proto/frame.h"
#include "proto/pack_format.h"

namespace expertd::daemon {

using wire::ErrorCode;

class CacheSink {
 public:
  virtual ~CacheSink() = default;
  virtual void acquire_granted(ClientId c, uint64_t request_id, uint64_t lease_id,
                               std::span<const uint32_t> slots, std::span<const uint8_t> ready) = 0;
  // `slot`: the slot of an expert granted after the acquire's reply (a later wave).
  virtual void expert_ready(ClientId c, uint64_t lease_id, uint32_t index, ErrorCode code,
                            const std::string& message, uint32_t slot) = 0;
  virtual void request_failed(ClientId c, uint64_t request_id, ErrorCode code,
                              const std::string& message) = 0;
  // An acquire the engine served itself from the residency board, learnt at a drain (trace).
  virtual void board_acquired(ClientId c, uint32_t layer, std::span<const uint32_t> experts) {
    (void)c, (void)layer, (void)experts;
  }
};

struct CacheConfig {
  uint32_t read_splits = 1;
  uint32_t max_experts_per_request = 16;
  uint32_t waiting_acquires_max = 256;
  uint32_t acquire_wait_ms_max = 30000;
  uint32_t prefetch_inflight_max = 0;  // 0 = slot_count / 4
  bool verify_checksums = true;
  bool prefetch_admit_always = false;  // a hint may evict the policy's victim, colder or not
  // A hint evicts the policy's victim among experts no hint of the current step named (a step:
  // from an acquire of a lower layer than the one before), and every eviction spares those
  // first: a burst of hints (speculative drafts' routing) never evicts its own.
  bool prefetch_admit_spare = false;
};

enum class IdsFor { Acquire, Board, Hint };

class Cache {
 public:
  Cache(const pack::Manifest& manifest, SlotArena& arena, EvictionPolicy& policy, CacheSink& sink,
        CacheConfig cfg);
  void set_io(BlockReader* io) { io_ = io; }
  // The residency board engines pin hits from without a round trip (proto/board.h); without
  // one every acquire comes through the socket.
  void set_board(Board* board);
  // An engine took board place `place`; disconnect() frees it.
  void attach(ClientId c, uint32_t place);
  // Counts the acquires engines served from the board since the last drain as the socket's
  // acquires are counted (hits, recency, popularity, affinity, trace). Run before anything that
  // reads those (a grant, an eviction, stats) and on the timer.
  void drain_board();

  // A layer's experts, any number of them: granted in waves of at most max_experts_per_request
  // pins (what is resident first); the rest's misses are read at once with the first wave's.
  void acquire(ClientId c, uint64_t request_id, uint32_t layer, std::span<const uint32_t> experts);
  // The engine is finished with these experts of its lease: their pins go, the next wave comes.
  void done(ClientId c, uint64_t request_id, uint64_t lease_id, std::span<const uint32_t> indices);
  void release(ClientId c, uint64_t request_id, uint64_t lease_id);
  void prefetch(uint32_t layer, std::span<const uint32_t> experts);
  // The rest of a layer a client will acquire in its next requests (it needs more experts than
  // one acquire may pin): the resident ones are touched now, the misses read at once at demand
  // priority into unpinned slots, so every miss of the layer is in flight together.
  void announce(uint32_t layer, std::span<const uint32_t> experts);
  void disconnect(ClientId c);
  void evict_all();                            // every unpinned READY slot
  void expire_waiting();                       // timer: fail acquires that waited too long
  void on_read_done(uint64_t job, Status st);  // from the BlockReader

  // Checks an acquire/prefetch's ids; "" when valid.
  std::pair<ErrorCode, std::string> check_ids(uint32_t layer, std::span<const uint32_t> experts,
                                              IdsFor what) const;

  // Acquires per (layer, expert), layer-major, aged as the policy ages them: what a state file
  // keeps across restarts.
  const std::vector<uint32_t>& popularity() const { return frequency_; }
  // A warm start from an earlier run's popularity: the policy ranks with it, and the most
  // popular experts are read into free slots (prefetch priority, never evicting, as capacity
  // frees; demand reads go first). Returns how many experts were queued.
  size_t warm_start(std::span<const uint32_t> frequency);

  Stats& stats() { return stats_; }
  Gauges gauges() const;
  uint32_t max_experts_per_request() const { return cfg_.max_experts_per_request; }
  const Affinity* affinity() const { return affinity_.get(); }  // lfru+affinity's model, or null
  // The dashboards' residency map (ExpertsRequest): one char per (layer, expert), layer-major,
  // into out (n_layers x n_experts): 'V' in a VRAM slot (cuda arena), 'H' in a host slot or the
  // host tier under VRAM, 'L' being read, '.' absent.
  void residency(std::span<uint8_t> out) const;
  // For tests and status: the slot holding (layer, expert), or -1.
  int32_t slot_of(uint32_t layer, uint32_t expert) const { return index_[key(layer, expert)]; }

 private:
  enum class State : uint8_t { Free, Loading, Ready };
  struct Waiter {
    uint64_t lease_id;
    uint32_t index;
  };
  struct Slot {
    State state = State::Free;
    uint32_t layer = 0, expert = 0;
    uint32_t pins = 0;
    uint64_t last_access = 0, inserted = 0;
    bool prefetched = false;
    bool demand = false;
    bool started_as_prefetch = false;
    uint64_t hint_round = 0;  // the step a hint last named it in (0: none since its last use)
    // Announced (Cache::announce): the access is counted already (kTouched), and a slot the
    // announce loaded (kLoaded) counts as a miss when it is acquired, not a hit.
    enum : uint8_t { kNone, kTouched, kLoaded } announce = kNone;
    std::chrono::steady_clock::time_point read_start;
    std::vector<Waiter> waiters;
  };
  struct Pending {
    ClientId client;
    uint64_t request_id;
    uint32_t layer;
    std::vector<uint32_t> experts;
    std::chrono::steady_clock::time_point start;
  };

  size_t key(uint32_t layer, uint32_t expert) const { return size_t{layer} * n_experts_ + expert; }
  bool can_grant(uint32_t layer, std::span<const uint32_t> experts) const;
  bool grant(const Pending& p);  // false: no room after all (board pins), nothing changed
  // The lease's next experts up to the pin budget; false when a slot is short (it waits).
  bool grant_more(uint64_t lease_id);
  std::vector<uint32_t> grant_order(uint32_t layer, std::span<const uint32_t> experts) const;
  // Pins expert i of the lease, resident in slot s / read into the free slot s; true when ready.
  bool pin_resident(Lease& l, uint64_t lease_id, uint32_t i, uint32_t s);
  bool load_fresh(Lease& l, uint64_t lease_id, uint32_t i, uint32_t s);
  void drain_waiting();
  int32_t take_slot();  // a FREE slot, or the policy's victim; -1 when none
  // The policy's victim among unpinned READY slots, not evicted; -1 when none. spare_round > 0:
  // none that a hint named in that step.
  int32_t pick_victim(uint64_t spare_round = 0) const;
  // False when an engine pinned the slot from the board: it stays.
  bool evict(uint32_t slot);
  // True when the expert was copied up from the host tier: READY at once, no read.
  bool start_load(uint32_t slot, uint32_t layer, uint32_t expert, bool demand);
  void demote(uint32_t slot);  // an evicted expert copied down into the host tier
  void issue_read(uint32_t slot);
  void issue_deferred();
  void issue_warm();
  void finish_load(uint32_t slot, Status st, ErrorCode code);
  void pin(uint32_t slot);  // a lease's pin on a resident slot
  void unpin(uint32_t slot);
  void lease_progress(uint64_t lease_id, uint32_t index, ErrorCode code, const std::string& msg);
  void touch(uint32_t slot);
  void board_acquired(ClientId c, uint32_t layer, std::span<const uint32_t> experts);
  // Reads which slots engines hold pins on from the board now: pick_victim passes them by.
  void mark_board_pins() const;
  bool board_pinned(uint32_t slot) const { return board_ && board_mark_[slot] == board_epoch_; }

  const pack::Manifest& m_;
  SlotArena& arena_;
  EvictionPolicy& policy_;
  CacheSink& sink_;
  CacheConfig cfg_;
  BlockReader* io_ = nullptr;
  uint32_t n_experts_;
  std::vector<Slot> slots_;
  std::vector<int32_t> index_;       // (layer, expert) -> slot or -1
  std::vector<uint32_t> frequency_;  // (layer, expert) -> acquires (aged by lfru)
  std::vector<uint32_t> free_;
  Leases leases_;
  std::deque<Pending> waiting_;
  // The host tier (arena_.host_slot_count() > 0): experts evicted from VRAM, least recently
  // demoted out first; an expert is in VRAM or the host tier, not both.
  HostTier host_;
  std::vector<std::pair<uint32_t, uint32_t>> warm_;  // (layer, expert) to read, most popular last
  uint64_t clock_ = 0, accesses_ = 0;
  uint64_t hint_round_ = 1;          // prefetch_admit_spare: the current step
  uint32_t last_acquire_layer_ = 0;  // a lower layer starts a step
  uint32_t prefetch_inflight_ = 0, loading_ = 0;
  // Loads waiting for the arena to take another read (cuda: a free staging buffer).
  std::deque<uint32_t> deferred_demand_, deferred_prefetch_;
  uint32_t reads_in_flight_ = 0;
  uint32_t evictable_ = 0;  // slots READY with no pins
  // lfru+affinity: the model, and while a grant allocates its misses, whose step is evicting.
  std::unique_ptr<Affinity> affinity_;
  int64_t evicting_client_ = -1;
  uint32_t evicting_layer_ = 0;
  // Each slot's chance, computed once per grant (a grant's misses look at the same candidates).
  mutable std::vector<double> affinity_of_;
  mutable std::vector<uint64_t> affinity_grant_;
  uint64_t grants_ = 0;
  Board* board_ = nullptr;
  std::vector<std::pair<ClientId, uint32_t>> places_;  // engines with a board place
  mutable std::vector<uint64_t> board_mark_;           // slot -> board_epoch_ when pinned
  mutable uint64_t board_epoch_ = 0;
  mutable std::vector<uint32_t> board_pins_;
  Stats stats_;
};

}  // namespace expertd::daemon
