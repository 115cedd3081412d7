// The host tier's bookkeeping (cuda arena, --host-cache-mib): which expert each pinned host slot
// holds and the order they were demoted in, oldest out first. An expert is in VRAM or in the host
// tier, never both. The copies themselves are the arena's (SlotArena::demote/promote).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace expertd::daemon {

class HostTier {
 public:
  HostTier() = default;
  HostTier(size_t n_keys, uint32_t host_slots);
  bool enabled() const { return !slot_of_.empty(); }
  uint32_t slot_count() const { return static_cast<uint32_t>(key_.size()); }
  uint32_t slots_used() const { return slot_count() - static_cast<uint32_t>(free_.size()); }
  int32_t slot_of(size_t key) const { return slot_of_[key]; }  // -1 when not held

  // A host slot for a demotion: a free one, or the least recently demoted one's (its expert
  // leaves the tier: *evicted is set).
  uint32_t take(bool* evicted);
  void hold(uint32_t h, size_t key);  // h holds key now, the newest demotion
  void free(uint32_t h);              // empties h (and its expert's entry)
  void clear();                       // every slot free: a cold start

 private:
  void unlink(uint32_t h);        // out of the demotion order
  std::vector<int32_t> slot_of_;  // key -> host slot or -1
  std::vector<int64_t> key_;      // host slot -> key or -1
  std::vector<uint32_t> free_;
  // The held host slots in demotion order (a list through prev_/next_), oldest first.
  std::vector<int32_t> prev_, next_;
  int32_t oldest_ = -1, newest_ = -1;
};

}  // namespace expertd::daemon
