#include "daemon/policy.h"

namespace expertd::daemon {
namespace {

class Lru final : public EvictionPolicy {
 public:
  std::string name() const override { return "lru"; }
  bool before(const SlotView& a, const SlotView& b) const override {
    return a.last_access < b.last_access;
  }
};

// Least frequently used; ties go to the oldest load.
class Lfu final : public EvictionPolicy {
 public:
  std::string name() const override { return "lfu"; }
  bool before(const SlotView& a, const SlotView& b) const override {
    if (a.frequency != b.frequency) return a.frequency < b.frequency;
    return a.inserted < b.inserted;
  }
};

// Frequency, then recency; frequencies are halved every 8 x slot_count accesses so a shift in
// popularity (a new prompt, another client) is followed.
class Lfru final : public EvictionPolicy {
 public:
  std::string name() const override { return "lfru"; }
  bool before(const SlotView& a, const SlotView& b) const override {
    if (a.frequency != b.frequency) return a.frequency < b.frequency;
    return a.last_access < b.last_access;
  }
  bool wants_aging(uint64_t accesses, uint32_t slot_count) const override {
    uint64_t period = uint64_t{slot_count} * 8;
    return period && accesses % period == 0;
  }
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_policy(const std::string& name) {
  if (name == "lru") return std::make_unique<Lru>();
  if (name == "lfu") return std::make_unique<Lfu>();
  if (name == "lfru") return std::make_unique<Lfru>();
  return nullptr;
}

std::string policy_names() {
  return "lru, lfu, lfru";
}

}  // namespace expertd::daemon
