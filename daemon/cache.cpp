#include "daemon/cache.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cassert>

namespace expertd::daemon {

using Clock = std::chrono::steady_clock;

namespace {
uint64_t us_since(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count());
}
}  // namespace

Cache::Cache(const pack::Manifest& manifest, SlotArena& arena, EvictionPolicy& policy,
             CacheSink& sink, CacheConfig cfg)
    : m_(manifest),
      arena_(arena),
      policy_(policy),
      sink_(sink),
      cfg_(cfg),
      n_experts_(manifest.n_experts) {
  slots_.resize(arena.slot_count());
  for (uint32_t i = arena.slot_count(); i > 0; --i) free_.push_back(i - 1);
  index_.assign(size_t{manifest.layers.size()} * n_experts_, -1);
  frequency_.assign(index_.size(), 0);
  host_ = HostTier(index_.size(), arena.host_slot_count());
  if (cfg_.prefetch_inflight_max == 0)
    cfg_.prefetch_inflight_max = std::max(1u, arena.slot_count() / 4);
  if (policy_.wants_affinity()) {
    affinity_ =
        std::make_unique<Affinity>(static_cast<uint32_t>(manifest.layers.size()), n_experts_);
    affinity_of_.assign(slots_.size(), 0.0);
    affinity_grant_.assign(slots_.size(), 0);
  }
  stats_.reset(manifest.layers.size(), n_experts_);
}

std::pair<ErrorCode, std::string> Cache::check_ids(uint32_t layer,
                                                   std::span<const uint32_t> experts,
                                                   IdsFor for_acquire) const {
  if (layer >= m_.layers.size())
    return {ErrorCode::OutOfRange, "layer " + std::to_string(layer) +
                                       " out of range (the pack has " +
                                       std::to_string(m_.layers.size()) + " MoE layers)"};
  if (experts.empty()) return {ErrorCode::BadRequest, "no expert ids"};
  // An acquire of more than max_experts_per_request is granted in waves (Done frees a wave's
  // pins); a board acquire is one wave at most.
  const size_t max = for_acquire == IdsFor::Board ? cfg_.max_experts_per_request : n_experts_;
  if (experts.size() > max)
    return {ErrorCode::BadRequest,
            std::to_string(experts.size()) + " experts exceed " +
                (for_acquire == IdsFor::Board ? "max_experts_per_request " + std::to_string(max)
                                              : "the layer's " + std::to_string(max) + " experts")};
  std::vector<uint32_t> sorted(experts.begin(), experts.end());
  std::sort(sorted.begin(), sorted.end());
  if (sorted.back() >= n_experts_)
    return {ErrorCode::OutOfRange, "expert " + std::to_string(sorted.back()) +
                                       " out of range (layer has " + std::to_string(n_experts_) +
                                       " experts)"};
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return {ErrorCode::BadRequest, "duplicate expert id in one request"};
  return {ErrorCode::None, ""};
}

void Cache::acquire(ClientId c, uint64_t request_id, uint32_t layer,
                    std::span<const uint32_t> experts) {
  auto [code, err] = check_ids(layer, experts, IdsFor::Acquire);
  if (code != ErrorCode::None) {
    ++stats_.c.client_errors;
    return sink_.request_failed(c, request_id, code, err);
  }
  bool queued = std::any_of(waiting_.begin(), waiting_.end(),
                            [&](const Pending& p) { return p.client == c; });
  if (leases_.of(c) || queued) {
    ++stats_.c.client_errors;
    return sink_.request_failed(
        c, request_id, ErrorCode::BadRequest,
        "this client already holds or awaits a lease; release it before the next acquire");
  }
  if (layer < last_acquire_layer_) ++hint_round_;  // a new step: its hints are to come
  last_acquire_layer_ = layer;
  Pending p{c, request_id, layer, {experts.begin(), experts.end()}, Clock::now()};
  if (waiting_.empty() && can_grant(layer, experts) && grant(p)) return;
  if (waiting_.size() >= cfg_.waiting_acquires_max)
    return sink_.request_failed(c, request_id, ErrorCode::Busy,
                                "too many acquires waiting for free slots");
  ++stats_.c.acquire_waits;
  waiting_.push_back(std::move(p));
}

bool Cache::can_grant(uint32_t layer, std::span<const uint32_t> experts) const {
  mark_board_pins();
  uint64_t needed = 0, own_evictable = 0, board_held = 0;
  const std::vector<uint32_t> order = grant_order(layer, experts);
  const size_t wave = std::min<size_t>(order.size(), cfg_.max_experts_per_request);
  for (size_t w = 0; w < wave; ++w) {  // the first wave's room: later waves find it as they go
    const uint32_t e = experts[order[w]];
    int32_t s = index_[key(layer, e)];
    if (s < 0)
      ++needed;
    else if (slots_[s].state == State::Ready && slots_[s].pins == 0 && !board_pinned(s))
      ++own_evictable;
  }
  // Evictable in the daemon's count but pinned by an engine from the board (each slot once).
  for (uint32_t s : board_pins_)  // each slot once (mark_board_pins)
    board_held += slots_[s].state == State::Ready && slots_[s].pins == 0;
  return needed <= free_.size() + evictable_ - board_held - own_evictable;
}

void Cache::set_board(Board* board) {
  board_ = board;
  board_mark_.assign(slots_.size(), 0);
}

void Cache::attach(ClientId c, uint32_t place) {
  if (board_) places_.push_back({c, place});
}

void Cache::mark_board_pins() const {
  if (!board_) return;
  ++board_epoch_;
  board_->pinned_slots(board_pins_);
  std::sort(board_pins_.begin(), board_pins_.end());  // a slot pinned by two engines: once
  board_pins_.erase(std::unique(board_pins_.begin(), board_pins_.end()), board_pins_.end());
  for (uint32_t s : board_pins_) board_mark_[s] = board_epoch_;
}

void Cache::drain_board() {
  for (const auto& [c, place] : places_)
    stats_.c.board_ring_lost +=
        board_->drain(place, [this, c = c](uint32_t layer, std::span<const uint32_t> experts) {
          board_acquired(c, layer, experts);
        });
}

// Counted as grant() counts an acquire whose experts are all ready (a hit each): the engine read
// the board at the time, and the slot may have been evicted since (then nothing is touched).
void Cache::board_acquired(ClientId c, uint32_t layer, std::span<const uint32_t> experts) {
  if (check_ids(layer, experts, IdsFor::Board).first != ErrorCode::None) {
    ++stats_.c.client_errors;
    return;
  }
  if (affinity_) affinity_->record(c, layer, experts);
  if (layer < last_acquire_layer_) ++hint_round_;  // as acquire()
  last_acquire_layer_ = layer;
  for (uint32_t e : experts) {
    const int32_t s = index_[key(layer, e)];
    const bool announced = s >= 0 && slots_[s].announce == Slot::kLoaded;
    if (announced)  // as grant() counts them
      stats_.miss(layer, e);
    else
      stats_.hit(layer, e);
    if (s < 0 || slots_[s].state != State::Ready) continue;
    Slot& sl = slots_[s];
    if (sl.prefetched) {
      ++stats_.c.prefetch_used;
      sl.prefetched = false;
    }
    const bool counted = sl.announce != Slot::kNone;
    sl.announce = Slot::kNone;
    if (!counted) touch(static_cast<uint32_t>(s));
  }
  ++stats_.c.acquires;
  ++stats_.c.board_acquires;
  ++stats_.c.releases;  // its release was the engine's own, too
  stats_.acquire_latency_us.record(0);
  sink_.board_acquired(c, layer, experts);
}

void Cache::touch(uint32_t s) {
  slots_[s].last_access = ++clock_;
  slots_[s].hint_round = 0;  // used: the hint is spent
  ++frequency_[key(slots_[s].layer, slots_[s].expert)];
  if (policy_.wants_aging(++accesses_, arena_.slot_count()))
    for (auto& f : frequency_) f /= 2;
}

std::vector<uint32_t> Cache::grant_order(uint32_t layer, std::span<const uint32_t> experts) const {
  std::vector<uint32_t> order;
  order.reserve(experts.size());
  for (uint32_t i = 0; i < experts.size(); ++i)
    if (index_[key(layer, experts[i])] >= 0) order.push_back(i);
  for (uint32_t i = 0; i < experts.size(); ++i)
    if (index_[key(layer, experts[i])] < 0) order.push_back(i);
  return order;
}

bool Cache::pin_resident(Lease& l, uint64_t lease_id, uint32_t i, uint32_t s) {
  Slot& sl = slots_[s];
  bool ready = false;
  if (sl.prefetched) {
    ++stats_.c.prefetch_used;
    sl.prefetched = false;
  }
  const bool counted = sl.announce != Slot::kNone;  // the announce made this access
  if (sl.announce == Slot::kLoaded && sl.state == State::Ready) {
    ready = true;  // read since the announce: a miss, whose wait overlapped earlier work
    stats_.miss(l.layer, l.experts[i]);
  } else if (sl.state == State::Ready) {
    ready = true;
    stats_.hit(l.layer, l.experts[i]);
  } else {
    stats_.miss(l.layer, l.experts[i]);
    ++stats_.c.cache_miss_joined;
    sl.waiters.push_back({lease_id, i});
    ++l.pending;
    if (!sl.demand) {
      sl.demand = true;
      io_->promote(static_cast<uint64_t>(s));
    }
  }
  sl.announce = Slot::kNone;
  if (!counted) touch(s);
  return ready;
}

bool Cache::load_fresh(Lease& l, uint64_t lease_id, uint32_t i, uint32_t s) {
  Slot& sl = slots_[s];
  sl.pins = 1;
  stats_.miss(l.layer, l.experts[i]);
  bool ready = start_load(s, l.layer, l.experts[i], true);  // true: copied up from the host tier
  if (!ready) {
    sl.waiters.push_back({lease_id, i});
    ++l.pending;
  }
  touch(s);
  return ready;
}

bool Cache::grant(const Pending& p) {
  const size_t n = p.experts.size();
  const std::vector<uint32_t> order = grant_order(p.layer, p.experts);
  const size_t wave = std::min<size_t>(n, cfg_.max_experts_per_request);
  std::vector<int32_t> held(n, -1);
  // The first wave: what is resident first, pinned so allocating the misses can never evict it;
  // then a slot for each miss. An engine may pin slots from the board after can_grant looked:
  // when the room is gone, nothing of this is kept and the acquire waits for the next release.
  for (size_t w = 0; w < wave; ++w) {
    const uint32_t i = order[w];
    int32_t s = index_[key(p.layer, p.experts[i])];
    if (s < 0) continue;
    pin(static_cast<uint32_t>(s));
    held[i] = s;
  }
  // The step is recorded before its misses pick victims (a grant retried after a rollback
  // records it again: rare, and only the affinity counts see it).
  if (affinity_) affinity_->record(p.client, p.layer, p.experts);
  evicting_client_ = p.client;  // the misses' evictions spare what this step will need
  evicting_layer_ = p.layer;
  ++grants_;
  std::vector<int32_t> fresh(n, -1);
  for (size_t w = 0; w < wave; ++w) {
    const uint32_t i = order[w];
    if (held[i] >= 0) continue;
    fresh[i] = take_slot();
    if (fresh[i] < 0) {
      evicting_client_ = -1;
      for (size_t j = 0; j < n; ++j) {
        if (held[j] >= 0) unpin(static_cast<uint32_t>(held[j]));
        if (fresh[j] >= 0) free_.push_back(static_cast<uint32_t>(fresh[j]));
      }
      return false;
    }
  }
  evicting_client_ = -1;
  auto [lease_id, lp] = leases_.open(p.client, p.layer, p.experts, order, p.start);
  Lease& l = *lp;
  l.slots.assign(n, proto::kNoSlot);
  l.held.assign(n, 0);
  l.next = wave;
  l.pinned = static_cast<uint32_t>(wave);
  std::vector<uint8_t> ready(n, 0);
  for (size_t w = 0; w < wave; ++w) {
    const uint32_t i = order[w];
    const uint32_t s = static_cast<uint32_t>(held[i] >= 0 ? held[i] : fresh[i]);
    l.slots[i] = s;
    l.held[i] = 1;
    ready[i] = held[i] >= 0 ? pin_resident(l, lease_id, i, s) : load_fresh(l, lease_id, i, s);
  }
  ++stats_.c.acquires;
  sink_.acquire_granted(p.client, p.request_id, lease_id, l.slots, ready);
  if (wave < n) {
    // More experts than one wave pins: the rest's misses are read now, with the first wave's, at
    // demand priority into unpinned slots; later waves find them resident or loading.
    std::vector<uint32_t> rest;
    for (size_t w = wave; w < n; ++w) rest.push_back(p.experts[order[w]]);
    announce(p.layer, rest);
    ++stats_.c.waves;
  }
  if (l.complete()) stats_.acquire_latency_us.record(us_since(p.start));
  return true;
}

bool Cache::grant_more(uint64_t lease_id) {
  Lease& l = *leases_.find(lease_id);
  const size_t n = l.experts.size();
  while (l.pinned < cfg_.max_experts_per_request && l.next < n) {
    const uint32_t i = l.order[l.next];
    int32_t s = index_[key(l.layer, l.experts[i])];
    bool ready;
    if (s >= 0) {
      pin(static_cast<uint32_t>(s));
      ready = pin_resident(l, lease_id, i, static_cast<uint32_t>(s));
    } else {
      evicting_client_ = l.client;
      evicting_layer_ = l.layer;
      ++grants_;
      s = take_slot();
      evicting_client_ = -1;
      if (s < 0) return false;  // no room now: its wave waits (Leases::wait)
      ready = load_fresh(l, lease_id, i, static_cast<uint32_t>(s));
    }
    l.slots[i] = static_cast<uint32_t>(s);
    l.held[i] = 1;
    ++l.pinned;
    ++l.next;
    if (ready) sink_.expert_ready(l.client, lease_id, i, ErrorCode::None, "", l.slots[i]);
  }
  if (l.complete()) stats_.acquire_latency_us.record(us_since(l.start));
  return true;
}

void Cache::done(ClientId c, uint64_t request_id, uint64_t lease_id,
                 std::span<const uint32_t> indices) {
  Lease* lp = leases_.find(lease_id, c);
  if (!lp) {
    ++stats_.c.client_errors;
    return sink_.request_failed(c, request_id, ErrorCode::BadRequest,
                                "unknown lease " + std::to_string(lease_id));
  }
  Lease& l = *lp;
  for (uint32_t i : indices) {
    if (i >= l.experts.size() || !l.held[i]) {
      ++stats_.c.client_errors;
      return sink_.request_failed(
          c, request_id, ErrorCode::BadRequest,
          "Done names index " + std::to_string(i) + ", which the lease does not hold");
    }
    if (slots_[l.slots[i]].state == State::Loading) {
      ++stats_.c.client_errors;
      return sink_.request_failed(
          c, request_id, ErrorCode::BadRequest,
          "Done names index " + std::to_string(i) + ", which is not ready yet");
    }
    l.held[i] = 0;
    --l.pinned;
    unpin(l.slots[i]);
  }
  ++stats_.c.dones;
  if (!leases_.waiting(lease_id) && !grant_more(lease_id)) leases_.wait(lease_id);
  drain_waiting();
}

int32_t Cache::pick_victim(uint64_t spare_round) const {
  int32_t best = -1;
  SlotView bv;
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    const Slot& sl = slots_[s];
    if (sl.state != State::Ready || sl.pins != 0 || board_pinned(s)) continue;
    if (spare_round != 0 && sl.hint_round == spare_round) continue;
    SlotView v{sl.last_access, sl.inserted, frequency_[key(sl.layer, sl.expert)], 0.0};
    if (affinity_ && evicting_client_ >= 0 && sl.layer > evicting_layer_) {
      if (affinity_grant_[s] != grants_) {  // a later layer's expert: held since the grant began
        affinity_of_[s] =
            affinity_->chance(static_cast<uint32_t>(evicting_client_), sl.layer, sl.expert);
        affinity_grant_[s] = grants_;
      }
      v.affinity = affinity_of_[s];
    }
    if (best < 0 || policy_.before(v, bv)) best = static_cast<int32_t>(s), bv = v;
  }
  return best;
}

int32_t Cache::take_slot() {
  if (!free_.empty()) {
    uint32_t s = free_.back();
    free_.pop_back();
    return static_cast<int32_t>(s);
  }
  mark_board_pins();
  for (;;) {
    int32_t best = cfg_.prefetch_admit_spare ? pick_victim(hint_round_) : -1;
    if (best < 0) best = pick_victim();
    if (best < 0 || evict(static_cast<uint32_t>(best))) return best;
  }
}

void Cache::demote(uint32_t s) {
  const Slot& sl = slots_[s];
  const size_t k = key(sl.layer, sl.expert);
  if (host_.slot_of(k) >= 0) return;
  bool evicted = false;  // the host tier's least recently demoted expert leaves it
  const uint32_t h = host_.take(&evicted);
  stats_.c.host_evictions += evicted;
  if (auto st = arena_.demote(s, h, m_.layers[sl.layer].stride); !st) {
    spdlog::error("{} (the expert is read from the drive when next needed)", st.error().message);
    host_.free(h);
    return;
  }
  host_.hold(h, k);
  ++stats_.c.host_demotions;
}

bool Cache::evict(uint32_t s) {
  Slot& sl = slots_[s];
  if (board_ && !board_->withdraw(s)) {
    board_mark_[s] = board_epoch_;  // pinned from the board since the last look
    return false;
  }
  if (host_.enabled()) demote(s);
  index_[key(sl.layer, sl.expert)] = -1;
  ++stats_.c.cache_evictions;
  if (sl.prefetched) ++stats_.c.prefetch_wasted;
  if (sl.announce != Slot::kNone) ++stats_.c.announced_lost;
  sl.announce = Slot::kNone;
  sl.prefetched = false;
  sl.state = State::Free;
  --evictable_;
  return true;
}

bool Cache::start_load(uint32_t s, uint32_t layer, uint32_t expert, bool demand) {
  Slot& sl = slots_[s];
  assert(sl.state == State::Free && sl.waiters.size() <= 1);
  sl.layer = layer;
  sl.expert = expert;
  sl.inserted = ++clock_;
  sl.last_access = sl.inserted;
  sl.prefetched = !demand;
  sl.demand = demand;
  index_[key(layer, expert)] = static_cast<int32_t>(s);
  if (host_.enabled())
    if (const int32_t h = host_.slot_of(key(layer, expert)); h >= 0) {
      // In the host tier: copied up (it moves: the host slot is free again; a later copy into it
      // is ordered after this one on the arena's stream).
      host_.free(static_cast<uint32_t>(h));
      if (auto st = arena_.promote(static_cast<uint32_t>(h), s, m_.layers[layer].stride); st) {
        sl.state = State::Ready;
        sl.started_as_prefetch = false;
        if (sl.pins == 0) ++evictable_;
        if (board_) board_->publish(s, static_cast<uint32_t>(key(layer, expert)));
        ++stats_.c.host_hits;
        return true;
      } else {
        spdlog::error("{} (reading the expert from the drive instead)", st.error().message);
      }
    }
  sl.state = State::Loading;
  sl.started_as_prefetch = !demand;
  sl.read_start = Clock::now();
  ++loading_;
  if (!demand) ++prefetch_inflight_;
  if (reads_in_flight_ >= arena_.max_reads_in_flight())
    (demand ? deferred_demand_ : deferred_prefetch_).push_back(s);
  else
    issue_read(s);
  return false;
}

void Cache::issue_read(uint32_t s) {
  Slot& sl = slots_[s];
  uint8_t* target = arena_.read_target(s);
  if (!target)
    return finish_load(s, make_error("the slot arena has no buffer for a read"),
                       ErrorCode::IoError);
  ++reads_in_flight_;
  io_->read(s, m_.offset(sl.layer, sl.expert), m_.layers[sl.layer].stride, target, cfg_.read_splits,
            sl.demand ? IoPriority::Demand : IoPriority::Prefetch);
}

void Cache::issue_deferred() {
  while (reads_in_flight_ < arena_.max_reads_in_flight() &&
         (!deferred_demand_.empty() || !deferred_prefetch_.empty())) {
    auto& q = deferred_demand_.empty() ? deferred_prefetch_ : deferred_demand_;
    uint32_t s = q.front();
    q.pop_front();
    issue_read(s);
  }
}

void Cache::on_read_done(uint64_t job, Status st) {
  uint32_t s = static_cast<uint32_t>(job);
  Slot& sl = slots_[s];
  assert(sl.state == State::Loading);
  --reads_in_flight_;
  if (!st) {
    arena_.abandon(s);
    finish_load(s, st, ErrorCode::IoError);
    return issue_deferred();
  }
  uint64_t stride = m_.layers[sl.layer].stride;
  if (cfg_.verify_checksums &&
      XXH3_64bits(arena_.read_target(s), stride) != m_.layers[sl.layer].checksums[sl.expert]) {
    ++stats_.c.checksum_errors;
    arena_.abandon(s);
    finish_load(s,
                make_error("checksum mismatch for layer " + std::to_string(sl.layer) + " expert " +
                           std::to_string(sl.expert) + " (corrupt pack)"),
                ErrorCode::ChecksumError);
    return issue_deferred();
  }
  // Published only after the bytes are verified (and, on cuda, copied and fenced by its event).
  arena_.publish(s, stride, [this, s](Status pst) { finish_load(s, pst, ErrorCode::IoError); });
  issue_deferred();
}

void Cache::finish_load(uint32_t s, Status st, ErrorCode code) {
  Slot& sl = slots_[s];
  --loading_;
  if (sl.started_as_prefetch) --prefetch_inflight_;
  stats_.read_latency_us.record(us_since(sl.read_start));
  std::vector<Waiter> waiters = std::move(sl.waiters);
  sl.waiters.clear();
  if (st) {
    ++stats_.c.pack_reads;
    stats_.c.pack_read_bytes += m_.layers[sl.layer].stride;
    sl.state = State::Ready;
    if (sl.pins == 0) ++evictable_;
    if (board_) board_->publish(s, static_cast<uint32_t>(key(sl.layer, sl.expert)));
    for (const auto& w : waiters) lease_progress(w.lease_id, w.index, ErrorCode::None, "");
  } else {
    ++stats_.c.io_errors;
    index_[key(sl.layer, sl.expert)] = -1;
    sl.state = State::Free;
    sl.prefetched = false;
    sl.announce = Slot::kNone;
    if (sl.pins == 0) free_.push_back(s);
    for (const auto& w : waiters) lease_progress(w.lease_id, w.index, code, st.error().message);
  }
  drain_waiting();
  issue_warm();
}

void Cache::lease_progress(uint64_t lease_id, uint32_t index, ErrorCode code,
                           const std::string& msg) {
  Lease* lp = leases_.find(lease_id);
  if (!lp) return;  // released meanwhile
  Lease& l = *lp;
  assert(l.pending > 0);
  --l.pending;
  sink_.expert_ready(l.client, lease_id, index, code, msg, l.slots[index]);
  if (l.complete()) stats_.acquire_latency_us.record(us_since(l.start));
}

void Cache::pin(uint32_t s) {
  Slot& sl = slots_[s];
  if (sl.state == State::Ready && sl.pins == 0) --evictable_;
  ++sl.pins;
}

void Cache::unpin(uint32_t s) {
  Slot& sl = slots_[s];
  assert(sl.pins > 0);
  if (--sl.pins > 0) return;
  if (sl.state == State::Ready)
    ++evictable_;
  else if (sl.state == State::Free)
    free_.push_back(s);
}

void Cache::release(ClientId c, uint64_t request_id, uint64_t lease_id) {
  const Lease* lp = leases_.find(lease_id, c);
  if (!lp) {
    ++stats_.c.client_errors;
    return sink_.request_failed(c, request_id, ErrorCode::BadRequest,
                                "unknown lease " + std::to_string(lease_id));
  }
  const Lease& l = *lp;
  for (size_t i = 0; i < l.experts.size(); ++i) {
    if (!l.held[i]) continue;  // not granted yet, or done
    auto& w = slots_[l.slots[i]].waiters;
    w.erase(
        std::remove_if(w.begin(), w.end(), [&](const Waiter& x) { return x.lease_id == lease_id; }),
        w.end());
    unpin(l.slots[i]);
  }
  leases_.close(lease_id);
  ++stats_.c.releases;
  drain_waiting();
}

void Cache::disconnect(ClientId c) {
  for (auto it = places_.begin(); it != places_.end(); ++it)
    if (it->first == c) {
      drain_board();  // what it took from the board still counts
      board_->clear_place(it->second);
      places_.erase(it);
      break;
    }
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [&](const Pending& p) { return p.client == c; }),
                 waiting_.end());
  if (auto id = leases_.of(c)) {
    --stats_.c.releases;  // not a release the client asked for
    release(c, 0, *id);
  } else {
    drain_waiting();
  }
}

void Cache::drain_waiting() {
  // Leases waiting for room for their next wave first: they hold pins already.
  while (const uint64_t id = leases_.first_waiting()) {
    if (!grant_more(id)) return;
    leases_.pop_waiting();
  }
  while (!waiting_.empty() && can_grant(waiting_.front().layer, waiting_.front().experts)) {
    if (!grant(waiting_.front())) return;  // engines pinned the room from the board meanwhile
    waiting_.pop_front();
  }
}

void Cache::expire_waiting() {
  drain_waiting();  // board pins let go of send no message: their room is noticed here
  while (!waiting_.empty() && us_since(waiting_.front().start) / 1000 >= cfg_.acquire_wait_ms_max) {
    Pending p = std::move(waiting_.front());
    waiting_.pop_front();
    ++stats_.c.acquire_timeouts;
    sink_.request_failed(
        p.client, p.request_id, ErrorCode::Busy,
        "waited " + std::to_string(cfg_.acquire_wait_ms_max) +
            " ms for free slots: the cache is too small for the clients' working sets");
  }
}

void Cache::prefetch(uint32_t layer, std::span<const uint32_t> experts) {
  const bool spare = cfg_.prefetch_admit_spare;
  for (uint32_t e : experts) {
    if (const int32_t r = index_[key(layer, e)]; r >= 0) {
      if (spare && slots_[r].state == State::Ready) slots_[r].hint_round = hint_round_;
      continue;
    }
    if (!waiting_.empty() || prefetch_inflight_ >= cfg_.prefetch_inflight_max) {
      ++stats_.c.prefetch_dropped;
      continue;
    }
    // Admission: a hint takes a free slot, or evicts only an expert acquired less often than
    // the hinted one (hints that evicted whatever the policy offered cost more than they saved
    // with small caches: a third of the experts cached, 11.5 vs 16.0 tok/s).
    int32_t s;
    if (!free_.empty()) {
      s = take_slot();
    } else {
      mark_board_pins();
      s = pick_victim(spare ? hint_round_ : 0);
      if (s >= 0 && !cfg_.prefetch_admit_always && !spare &&
          frequency_[key(layer, e)] <= frequency_[key(slots_[s].layer, slots_[s].expert)]) {
        ++stats_.c.prefetch_rejected;
        continue;
      }
      if (s >= 0 && !evict(static_cast<uint32_t>(s))) s = -1;
    }
    if (s < 0) {
      ++stats_.c.prefetch_dropped;
      continue;
    }
    ++stats_.c.prefetch_issued;
    start_load(static_cast<uint32_t>(s), layer, e, false);
    if (spare) slots_[s].hint_round = hint_round_;
  }
}

void Cache::announce(uint32_t layer, std::span<const uint32_t> experts) {
  // Resident ones first: touched as the acquire would, so the misses' loads do not evict them.
  for (uint32_t e : experts)
    if (int32_t s = index_[key(layer, e)]; s >= 0 && slots_[s].announce == Slot::kNone) {
      slots_[s].announce = Slot::kTouched;
      touch(static_cast<uint32_t>(s));
    }
  for (uint32_t e : experts) {
    if (index_[key(layer, e)] >= 0) continue;
    // Acquires waiting for slots come first; without a slot the acquire reads it as usual.
    int32_t s = waiting_.empty() ? take_slot() : -1;
    if (s < 0) continue;
    ++stats_.c.announced_reads;
    start_load(static_cast<uint32_t>(s), layer, e, true);
    slots_[s].announce = Slot::kLoaded;
    touch(static_cast<uint32_t>(s));
  }
}

size_t Cache::warm_start(std::span<const uint32_t> frequency) {
  if (frequency.size() != frequency_.size()) return 0;
  std::copy(frequency.begin(), frequency.end(), frequency_.begin());
  warm_.clear();
  for (uint32_t l = 0; l < m_.layers.size(); ++l)
    for (uint32_t e = 0; e < n_experts_; ++e)
      if (frequency_[key(l, e)] > 0) warm_.push_back({l, e});
  // Most popular last (taken from the back); ties in layer, then expert order.
  std::stable_sort(warm_.begin(), warm_.end(), [&](const auto& a, const auto& b) {
    return frequency_[key(a.first, a.second)] < frequency_[key(b.first, b.second)];
  });
  if (warm_.size() > slots_.size()) warm_.erase(warm_.begin(), warm_.end() - slots_.size());
  const size_t queued = warm_.size();
  issue_warm();
  return queued;
}

void Cache::issue_warm() {
  while (!warm_.empty() && waiting_.empty() && prefetch_inflight_ < cfg_.prefetch_inflight_max) {
    if (free_.empty()) return warm_.clear();  // the cache filled with what clients use
    auto [layer, e] = warm_.back();
    warm_.pop_back();
    if (index_[key(layer, e)] >= 0) continue;  // a client got there first
    int32_t s = take_slot();
    start_load(static_cast<uint32_t>(s), layer, e, false);
    slots_[s].prefetched = false;  // not a hint: counted as warm_reads
    ++stats_.c.warm_reads;
  }
}

void Cache::evict_all() {
  host_.clear();  // the host tier too: a cold start
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    Slot& sl = slots_[s];
    if (sl.state != State::Ready || sl.pins != 0) continue;
    if (board_ && !board_->withdraw(s)) continue;  // an engine reads it now
    index_[key(sl.layer, sl.expert)] = -1;
    sl.state = State::Free;
    sl.prefetched = false;
    sl.announce = Slot::kNone;
    --evictable_;
    free_.push_back(s);
  }
}

void Cache::residency(std::span<uint8_t> out) const {
  assert(out.size() == index_.size());
  const uint8_t in_slot = arena_.kind() == "cuda" ? 'V' : 'H';
  for (size_t k = 0; k < index_.size(); ++k) {
    const int32_t s = index_[k];
    if (s >= 0)
      out[k] = slots_[s].state == State::Loading ? 'L' : in_slot;
    else
      out[k] = host_.enabled() && host_.slot_of(k) >= 0 ? 'H' : '.';
  }
}

Gauges Cache::gauges() const {
  Gauges g;
  g.leases = leases_.size();
  g.slot_count = slots_.size();
  g.arena_huge_bytes = arena_.huge_page_bytes();
  mark_board_pins();
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    g.slots_used += slots_[s].state != State::Free;
    g.slots_pinned += slots_[s].pins > 0 || board_pinned(s);
  }
  g.slots_loading = loading_;
  g.acquires_waiting = waiting_.size();
  if (io_) {
    g.bytes_in_flight = io_->stats().bytes_in_flight;
    g.bytes_in_flight_max = io_->stats().bytes_in_flight_max;
    g.io_queued = io_->stats().queued;
  }
  g.h2d_bytes = arena_.h2d_bytes();
  g.copy_errors = arena_.copy_errors();
  g.stage_waits = arena_.stage_waits();
  g.d2h_bytes = arena_.d2h_bytes();
  g.host_slot_count = host_.slot_count();
  g.host_slots_used = host_.slots_used();
  g.reads_deferred = deferred_demand_.size() + deferred_prefetch_.size();
  return g;
}

}  // namespace expertd::daemon
