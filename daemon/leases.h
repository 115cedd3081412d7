// The cache's leases: which experts of a layer an engine holds, in what order they are granted
// and how far the waves have got; one lease per engine at a time; the leases whose next wave
// waits for room. Slots and pins stay the Cache's: a lease only records what it holds.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace expertd::daemon {

using ClientId = uint32_t;

struct Lease {
  ClientId client = 0;
  uint32_t layer = 0;
  std::vector<uint32_t> experts;
  std::vector<uint32_t> slots;  // proto::kNoSlot until granted
  std::vector<uint8_t> held;    // granted and not done: pinned
  std::vector<uint32_t> order;  // the grant order: what was resident first
  size_t next = 0;              // order[next] is granted next
  uint32_t pinned = 0;          // held, counted
  uint32_t pending = 0;         // granted, not ready yet
  std::chrono::steady_clock::time_point start;
  bool complete() const { return next == experts.size() && pending == 0; }  // all granted, ready
};

class Leases {
 public:
  // A new lease of engine c: its id and the lease (valid until close or another open).
  std::pair<uint64_t, Lease*> open(ClientId c, uint32_t layer, std::vector<uint32_t> experts,
                                   std::vector<uint32_t> order,
                                   std::chrono::steady_clock::time_point start) {
    const uint64_t id = next_id_++;
    Lease& l = leases_[id];
    l.client = c, l.layer = layer, l.experts = std::move(experts), l.order = std::move(order);
    l.start = start;
    of_client_[c] = id;
    return {id, &l};
  }
  Lease* find(uint64_t id) {  // null once released
    auto it = leases_.find(id);
    return it == leases_.end() ? nullptr : &it->second;
  }
  Lease* find(uint64_t id, ClientId c) {  // null unless engine c holds it
    Lease* l = find(id);
    return l && l->client == c ? l : nullptr;
  }
  std::optional<uint64_t> of(ClientId c) const {
    auto it = of_client_.find(c);
    return it == of_client_.end() ? std::nullopt : std::optional<uint64_t>(it->second);
  }
  // Forgets the lease (and its waiting wave).
  void close(uint64_t id) {
    auto it = leases_.find(id);
    if (it == leases_.end()) return;
    of_client_.erase(it->second.client);
    leases_.erase(it);
    waves_.erase(std::remove(waves_.begin(), waves_.end(), id), waves_.end());
  }
  size_t size() const { return leases_.size(); }

  // The leases whose next wave waits for room, oldest first (first_waiting: 0 when none).
  bool waiting(uint64_t id) const {
    return std::find(waves_.begin(), waves_.end(), id) != waves_.end();
  }
  void wait(uint64_t id) { waves_.push_back(id); }
  uint64_t first_waiting() const { return waves_.empty() ? 0 : waves_.front(); }
  void pop_waiting() { waves_.pop_front(); }

 private:
  std::unordered_map<uint64_t, Lease> leases_;
  std::unordered_map<ClientId, uint64_t> of_client_;
  std::deque<uint64_t> waves_;
  uint64_t next_id_ = 1;  // 0 is no lease
};

}  // namespace expertd::daemon
