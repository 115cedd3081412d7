// Eviction policies behind one interface. Each ranks evictable slots; the cache evicts the
// lowest rank. Frequencies are kept per (layer, expert), resident or not: MoE expert popularity
// is stable, so an expert's history outlives its slot.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace expertd::daemon {

struct SlotView {
  uint64_t last_access = 0;  // logical clock of the last acquire
  uint64_t inserted = 0;     // logical clock of the load
  uint32_t frequency = 0;    // acquires of the expert it holds
  // lfru+affinity: the chance that the acquiring step uses the expert at a layer still to come
  // (daemon/affinity.h); 0 for the others and for experts of the step's layers so far.
  double affinity = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string name() const = 0;
  // True when `a` should be evicted before `b`.
  virtual bool before(const SlotView& a, const SlotView& b) const = 0;
  // True when the cache should fill SlotView::affinity (and keep the model that gives it).
  virtual bool wants_affinity() const { return false; }
  // Called on every acquire of an expert with the running access count; lfru ages here.
  virtual bool wants_aging(uint64_t accesses, uint32_t slot_count) const {
    (void)accesses;
    (void)slot_count;
    return false;
  }
};

// "lru", "lfu", "lfru", "lfru+affinity"; nullptr for an unknown name.
std::unique_ptr<EvictionPolicy> make_policy(const std::string& name);
std::string policy_names();

}  // namespace expertd::daemon
