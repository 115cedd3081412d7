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

// lfru, with the count of an expert of a layer still to come in the acquiring step raised by 8x
// the chance that the step uses it: an eviction in the middle of a token's pass spares what its
// later layers are likely to need (replayed: ahead of lfru on every recorded trace, most with
// small caches; model/README.md).
class LfruAffinity final : public EvictionPolicy {
 public:
  std::string name() const override { return "lfru+affinity"; }
  bool before(const SlotView& a, const SlotView& b) const override {
    const double ca = a.frequency + 8.0 * a.affinity, cb = b.frequency + 8.0 * b.affinity;
    if (ca != cb) return ca < cb;
    return a.last_access < b.last_access;
  }
  bool wants_affinity() const override { return true; }
  bool wants_aging(uint64_t accesses, uint32_t slot_count) const override {
    return lfru_.wants_aging(accesses, slot_count);
  }

 private:
  Lfru lfru_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_policy(const std::string& name) {
  if (name == "lru") return std::make_unique<Lru>();
  if (name == "lfu") return std::make_unique<Lfu>();
  if (name == "lfru") return std::make_unique<Lfru>();
  if (name == "lfru+affinity") return std::make_unique<LfruAffinity>();
  return nullptr;
}

std::string policy_names() {
  return "lru, lfu, lfru, lfru+affinity";
}

}  // namespace expertd::daemon
