#include "daemon/trace_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <random>
#include <unordered_map>

#include "daemon/cache.h"
#include "daemon/cache_sim.h"
#include "daemon/policy.h"
#include "daemon/trace.h"

namespace expertd::daemon {

Result<Trace> read_trace(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rbe");
  if (!f) return errno_error("open trace " + path);
  Trace t;
  char magic[8];
  bool ok = std::fread(magic, 1, 8, f) == 8 && std::memcmp(magic, "XPRTTRC1", 8) == 0 &&
            std::fread(&t.n_layers, 4, 1, f) == 1 && std::fread(&t.n_experts, 4, 1, f) == 1;
  if (!ok || t.n_layers == 0 || t.n_experts == 0 || t.n_experts > 65536) {
    std::fclose(f);
    return make_error(path + ": not an expertd trace");
  }
  for (;;) {
    TraceRecord r;
    uint16_t layer, n;
    if (std::fread(&r.time_ns, 8, 1, f) != 1) break;
    if (std::fread(&r.client, 4, 1, f) != 1 || std::fread(&layer, 2, 1, f) != 1 ||
        std::fread(&n, 2, 1, f) != 1) {
      std::fclose(f);
      return make_error(path + ": truncated record " + std::to_string(t.records.size()));
    }
    const bool hint = (layer & kTraceHint) != 0;
    layer = static_cast<uint16_t>(layer & ~kTraceHint);
    r.layer = layer;
    std::vector<uint16_t> ids(n);
    if (n && std::fread(ids.data(), 2, n, f) != n) {
      std::fclose(f);
      return make_error(path + ": truncated record " + std::to_string(t.records.size()));
    }
    for (uint16_t e : ids) {
      if (e >= t.n_experts || layer >= t.n_layers) {
        std::fclose(f);
        return make_error(path + ": record " + std::to_string(t.records.size()) +
                          " is out of range");
      }
      r.experts.push_back(e);
    }
    if (hint)
      t.hints.push_back({t.records.size(), r.client, r.layer, std::move(r.experts)});
    else
      t.records.push_back(std::move(r));
  }
  std::fclose(f);
  return t;
}

namespace {

// Policies the daemon's comparator interface cannot express, each with its own queues: the
// simulator's lab (expert-bench policy). A policy sees hits and inserts and names a victim that
// is not pinned (the request's own experts), which it forgets.
class QueuePolicy {
 public:
  virtual ~QueuePolicy() = default;
  virtual void hit(size_t key) = 0;
  virtual void miss(size_t key) { (void)key; }  // before the eviction it may cause
  virtual void insert(size_t key) = 0;
  virtual size_t evict(const std::function<bool(size_t)>& pinned) = 0;
};

// A list with O(1) removal by key.
struct Lru {
  std::list<size_t> l;  // front: most recent
  std::unordered_map<size_t, std::list<size_t>::iterator> at;
  bool has(size_t k) const { return at.count(k) != 0; }
  void push_front(size_t k) { l.push_front(k), at[k] = l.begin(); }
  void erase(size_t k) {
    auto it = at.find(k);
    if (it == at.end()) return;
    l.erase(it->second), at.erase(it);
  }
  void to_front(size_t k) { erase(k), push_front(k); }
  size_t size() const { return l.size(); }
  // The least recent key not pinned, or SIZE_MAX.
  size_t last(const std::function<bool(size_t)>& pinned) const {
    for (auto it = l.rbegin(); it != l.rend(); ++it)
      if (!pinned(*it)) return *it;
    return SIZE_MAX;
  }
  size_t pop_back() {
    size_t k = l.back();
    erase(k);
    return k;
  }
};

// SIEVE (Zhang et al., NSDI '24): one FIFO, a visited bit, a hand that walks from the oldest
// entry clearing bits and evicts the first unvisited one; hits only set the bit.
class Sieve final : public QueuePolicy {
 public:
  void hit(size_t k) override { visited_[k] = true; }
  void insert(size_t k) override { q_.push_front(k), visited_[k] = false; }
  size_t evict(const std::function<bool(size_t)>& pinned) override {
    for (size_t steps = 0; steps < 2 * q_.size() + 2; ++steps) {
      if (hand_ == q_.l.end()) hand_ = std::prev(q_.l.end());
      size_t k = *hand_;
      auto next = hand_ == q_.l.begin() ? q_.l.end() : std::prev(hand_);
      if (!pinned(k) && !visited_[k]) {
        hand_ = next;
        q_.erase(k), visited_.erase(k);
        return k;
      }
      if (!pinned(k)) visited_[k] = false;
      hand_ = next;
    }
    return SIZE_MAX;
  }

 private:
  Lru q_;  // front: newest
  std::list<size_t>::iterator hand_ = q_.l.end();
  std::unordered_map<size_t, bool> visited_;
};

// S3-FIFO (Yang et al., SOSP '23): a small FIFO (10%) for new entries, a main FIFO with lazy
// promotion (a counter up to 3, reinsertion while it is positive), a ghost FIFO of keys
// evicted from the small one; an entry hit while small moves to main.
class S3Fifo final : public QueuePolicy {
 public:
  explicit S3Fifo(uint32_t slots)
      : small_cap_(std::max<uint32_t>(1, slots / 10)), ghost_cap_(slots) {}
  void hit(size_t k) override { freq_[k] = std::min(freq_[k] + 1, 3); }
  void insert(size_t k) override {
    freq_[k] = 0;
    if (ghost_.has(k))
      ghost_.erase(k), main_.push_front(k);
    else
      small_.push_front(k);
  }
  size_t evict(const std::function<bool(size_t)>& pinned) override {
    for (size_t steps = 0; steps < 4 * (small_.size() + main_.size()) + 4; ++steps) {
      if (small_.size() >= small_cap_ || main_.size() == 0) {
        size_t k = small_.last(pinned);
        if (k != SIZE_MAX) {
          small_.erase(k);
          if (freq_[k] > 0) {
            main_.push_front(k), freq_[k] = 0;
            continue;
          }
          ghost_.push_front(k);
          if (ghost_.size() > ghost_cap_) ghost_.pop_back();
          freq_.erase(k);
          return k;
        }
      }
      size_t k = main_.last(pinned);
      if (k == SIZE_MAX) return small_.last(pinned) == SIZE_MAX ? SIZE_MAX : evict_small(pinned);
      if (freq_[k] > 0) {
        --freq_[k], main_.to_front(k);
        continue;
      }
      main_.erase(k), freq_.erase(k);
      return k;
    }
    return SIZE_MAX;
  }

 private:
  size_t evict_small(const std::function<bool(size_t)>& pinned) {
    size_t k = small_.last(pinned);
    small_.erase(k), freq_.erase(k);
    ghost_.push_front(k);
    if (ghost_.size() > ghost_cap_) ghost_.pop_back();
    return k;
  }
  uint32_t small_cap_, ghost_cap_;
  Lru small_, main_, ghost_;
  std::unordered_map<size_t, int> freq_;
};

// ARC (Megiddo and Modha, FAST '03): recency (T1) and frequency (T2) lists with ghosts (B1, B2)
// steering the target size p of T1.
class Arc final : public QueuePolicy {
 public:
  explicit Arc(uint32_t slots) : c_(slots) {}
  void hit(size_t k) override {
    t1_.erase(k);
    t2_.to_front(k);
  }
  void miss(size_t k) override {  // a ghost hit moves the target before the replacement
    if (b1_.has(k))
      p_ = std::min<double>(
          c_, p_ + std::max(1.0, double(b2_.size()) / std::max<size_t>(1, b1_.size())));
    else if (b2_.has(k))
      p_ = std::max(0.0, p_ - std::max(1.0, double(b1_.size()) / std::max<size_t>(1, b2_.size())));
  }
  void insert(size_t k) override {
    if (b1_.has(k)) {
      b1_.erase(k), t2_.push_front(k);
    } else if (b2_.has(k)) {
      b2_.erase(k), t2_.push_front(k);
    } else {
      t1_.push_front(k);
    }
    while (b1_.size() + t1_.size() > c_ && b1_.size()) b1_.pop_back();
    while (b1_.size() + b2_.size() + t1_.size() + t2_.size() > 2 * size_t{c_} && b2_.size())
      b2_.pop_back();
  }
  size_t evict(const std::function<bool(size_t)>& pinned) override {
    const bool from_t1 =
        t1_.size() > 0 && (double(t1_.size()) > p_ || t2_.last(pinned) == SIZE_MAX);
    size_t k = from_t1 ? t1_.last(pinned) : t2_.last(pinned);
    if (k == SIZE_MAX) k = from_t1 ? t2_.last(pinned) : t1_.last(pinned);
    if (k == SIZE_MAX) return k;
    if (t1_.has(k))
      t1_.erase(k), b1_.push_front(k);
    else
      t2_.erase(k), b2_.push_front(k);
    return k;
  }

 private:
  uint32_t c_;
  double p_ = 0;
  Lru t1_, t2_, b1_, b2_;
};

// 2Q (Johnson and Shasha, VLDB '94), the full version: new entries in a FIFO (A1in, 25%), keys
// evicted from it remembered (A1out, 50%), an entry seen again while remembered goes to an LRU
// (Am).
class TwoQ final : public QueuePolicy {
 public:
  explicit TwoQ(uint32_t slots)
      : kin_(std::max<uint32_t>(1, slots / 4)), kout_(std::max<uint32_t>(1, slots / 2)) {}
  void hit(size_t k) override {
    if (am_.has(k)) am_.to_front(k);
  }
  void insert(size_t k) override {
    if (a1out_.has(k))
      a1out_.erase(k), am_.push_front(k);
    else
      a1in_.push_front(k);
  }
  size_t evict(const std::function<bool(size_t)>& pinned) override {
    size_t k = SIZE_MAX;
    if (a1in_.size() > kin_ || am_.last(pinned) == SIZE_MAX) k = a1in_.last(pinned);
    if (k != SIZE_MAX) {
      a1in_.erase(k), a1out_.push_front(k);
      if (a1out_.size() > kout_) a1out_.pop_back();
      return k;
    }
    k = am_.last(pinned);
    if (k != SIZE_MAX) am_.erase(k);
    return k;
  }

 private:
  uint32_t kin_, kout_;
  Lru a1in_, a1out_, am_;
};

// LeCaR (Vietri et al., HotStorage '18): LRU and LFU as experts, weights learned from regret (an
// entry missed while in an expert's eviction history costs that expert), a random choice by
// weight (seeded: replays are reproducible).
class LeCaR final : public QueuePolicy {
 public:
  explicit LeCaR(uint32_t slots)
      : slots_(slots), discount_(std::pow(0.005, 1.0 / std::max<uint32_t>(1, slots))) {}
  void hit(size_t k) override { ++freq_[k], lru_.to_front(k), ++time_; }
  void insert(size_t k) override {
    ++time_;
    for (int e = 0; e < 2; ++e) {
      auto it = evicted_at_[e].find(k);
      if (it == evicted_at_[e].end()) continue;
      const double r = std::pow(discount_, double(time_ - it->second));
      w_[e] *= std::exp(-kRate * r);  // expert e evicted what was wanted again
      hist_[e].erase(k), evicted_at_[e].erase(it);
    }
    const double sum = w_[0] + w_[1];
    w_[0] /= sum, w_[1] /= sum;
    freq_[k] += 1;
    lru_.push_front(k);
  }
  size_t evict(const std::function<bool(size_t)>& pinned) override {
    const int e = std::uniform_real_distribution<double>(0, 1)(rng_) < w_[0] ? 0 : 1;
    size_t k = e == 0 ? lru_.last(pinned) : least_frequent(pinned);
    if (k == SIZE_MAX) return k;
    lru_.erase(k);
    hist_[e].push_front(k), evicted_at_[e][k] = time_;
    if (hist_[e].size() > slots_) evicted_at_[e].erase(hist_[e].pop_back());
    return k;
  }

 private:
  static constexpr double kRate = 0.45;
  size_t least_frequent(const std::function<bool(size_t)>& pinned) const {
    size_t best = SIZE_MAX;
    uint64_t bf = UINT64_MAX;
    for (auto it = lru_.l.rbegin(); it != lru_.l.rend(); ++it)  // ties: the least recent
      if (!pinned(*it) && freq_.at(*it) < bf) bf = freq_.at(*it), best = *it;
    return best;
  }
  uint32_t slots_;
  double discount_, w_[2] = {0.5, 0.5};
  uint64_t time_ = 0;
  Lru lru_, hist_[2];
  std::unordered_map<size_t, uint64_t> evicted_at_[2];
  std::unordered_map<size_t, uint64_t> freq_;
  std::mt19937_64 rng_{42};
};

std::unique_ptr<QueuePolicy> make_queue_policy(const std::string& name, uint32_t slots) {
  if (name == "sieve") return std::make_unique<Sieve>();
  if (name == "s3fifo") return std::make_unique<S3Fifo>(slots);
  if (name == "arc") return std::make_unique<Arc>(slots);
  if (name == "2q") return std::make_unique<TwoQ>(slots);
  if (name == "lecar") return std::make_unique<LeCaR>(slots);
  return nullptr;
}

// The same order of events as simulate(): each request's resident experts first, then its
// misses, its experts pinned until it ends.
Result<SimResult> simulate_queue(const Trace& t, uint32_t slots, QueuePolicy& p) {
  const size_t keys = size_t{t.n_layers} * t.n_experts;
  std::vector<uint8_t> resident(keys, 0), pinned(keys, 0);
  uint32_t used = 0;
  SimResult res;
  auto is_pinned = [&](size_t k) { return pinned[k] != 0; };
  for (const auto& r : t.records) {
    if (r.experts.size() > slots)
      return make_error("a request of " + std::to_string(r.experts.size()) + " experts exceeds " +
                        std::to_string(slots) + " slots");
    for (uint32_t e : r.experts) {
      const size_t k = size_t{r.layer} * t.n_experts + e;
      if (!resident[k]) continue;
      ++res.hits, pinned[k] = 1, p.hit(k);
    }
    for (uint32_t e : r.experts) {
      const size_t k = size_t{r.layer} * t.n_experts + e;
      if (resident[k]) continue;
      ++res.misses;
      p.miss(k);
      if (used == slots) {
        const size_t v = p.evict(is_pinned);
        if (v == SIZE_MAX || !resident[v] || pinned[v])
          return make_error("the policy named no evictable slot");
        resident[v] = 0, --used, ++res.evictions;
      }
      resident[k] = 1, pinned[k] = 1, ++used;
      p.insert(k);
    }
    for (uint32_t e : r.experts) pinned[size_t{r.layer} * t.n_experts + e] = 0;
  }
  return res;
}

// The daemon's policies replay through the real Cache (daemon/cache_sim.h): each record an
// acquire of its experts in one wave, its reads completed, its lease released.
Result<SimResult> simulate_cache(const Trace& t, uint32_t slots, EvictionPolicy& policy,
                                 int hints = 0) {  // 0: none, 1: colder, 2: always, 3: spare
  const pack::Manifest m = sim::manifest(t.n_layers, t.n_experts);
  sim::NullArena arena(slots, 4096);
  sim::RecordingSink sink;
  sim::QueuedReader reader;
  CacheConfig cfg;
  cfg.verify_checksums = false;         // nothing is read
  cfg.max_experts_per_request = slots;  // a record is one wave
  cfg.waiting_acquires_max = 1;
  cfg.prefetch_admit_always = hints == 2;
  cfg.prefetch_admit_spare = hints == 3;
  Cache cache(m, arena, policy, sink, cfg);
  cache.set_io(&reader);
  uint64_t request = 0;
  size_t hi = 0;
  for (size_t ri = 0; ri < t.records.size(); ++ri) {
    // The hints sent since the last acquire, as the daemon takes them (its limit on prefetch
    // reads in flight drops the rest of a burst); their reads complete before the acquire.
    for (; hi < t.hints.size() && t.hints[hi].before <= ri; ++hi)
      if (hints) cache.prefetch(t.hints[hi].layer, t.hints[hi].experts);
    reader.complete_all(cache);
    const auto& r = t.records[ri];
    if (r.experts.size() > slots)
      return make_error("a request of " + std::to_string(r.experts.size()) + " experts exceeds " +
                        std::to_string(slots) + " slots");
    const uint64_t id = ++request;
    cache.acquire(r.client, id, r.layer, r.experts);
    reader.complete_all(cache);
    if (!sink.failures.empty())
      return make_error("record " + std::to_string(ri) + ": " + sink.failures.back().message);
    if (sink.grants.empty() || sink.grants.back().request_id != id)
      return make_error("record " + std::to_string(ri) + " was not granted");
    cache.release(r.client, ++request, sink.grants.back().lease_id);
  }
  const auto& c = cache.stats().c;
  return SimResult{c.cache_hits, c.cache_misses, c.cache_evictions, c.prefetch_issued,
                   c.prefetch_used};
}

}  // namespace

Trace in_waves(const Trace& t, uint32_t slots) {
  Trace w;
  w.n_layers = t.n_layers, w.n_experts = t.n_experts;
  size_t hi = 0;
  for (size_t ri = 0; ri < t.records.size(); ++ri) {
    for (; hi < t.hints.size() && t.hints[hi].before <= ri; ++hi) {
      w.hints.push_back(t.hints[hi]);
      w.hints.back().before = w.records.size();
    }
    const auto& r = t.records[ri];
    for (size_t at = 0; at < r.experts.size() || at == 0; at += slots) {
      TraceRecord c{r.time_ns, r.client, r.layer, {}};
      const size_t end = std::min(r.experts.size(), at + slots);
      c.experts.assign(r.experts.begin() + at, r.experts.begin() + end);
      w.records.push_back(std::move(c));
      if (end == r.experts.size()) break;
    }
  }
  for (; hi < t.hints.size(); ++hi) {
    w.hints.push_back(t.hints[hi]);
    w.hints.back().before = w.records.size();
  }
  return w;
}

std::vector<std::string> lab_policy_names() {
  return {"sieve", "s3fifo", "arc", "2q", "lecar"};
}

Result<SimResult> simulate(const Trace& t, uint32_t slots, const std::string& policy_name) {
  if (slots == 0) return make_error("no slots");
  if (auto q = make_queue_policy(policy_name, slots)) return simulate_queue(t, slots, *q);
  for (const auto& [suffix, mode] :
       {std::pair{"+hints", 1}, std::pair{"+hints-always", 2}, std::pair{"+hints-spare", 3}})
    if (policy_name.ends_with(suffix)) {
      auto p = make_policy(policy_name.substr(0, policy_name.size() - std::strlen(suffix)));
      if (!p) return make_error("unknown policy " + policy_name);
      return simulate_cache(t, slots, *p, mode);
    }
  const bool belady = policy_name == "belady";
  // "lfru+hH": the knowledge horizon (see trace_sim.h).
  int64_t horizon = -1;
  std::string base = policy_name;
  if (policy_name.starts_with("lfru+h")) {
    const std::string h = policy_name.substr(6);
    if (h.empty() || h.size() > 9 || h.find_first_not_of("0123456789") != std::string::npos)
      return make_error("unknown policy " + policy_name);
    horizon = std::stoll(h);
    base = "lfru";
  }
  // "lfru+drafts", "lfru+drafts+prefetch": the step's hints as knowledge (see trace_sim.h).
  const int drafts = policy_name == "lfru+drafts"            ? 1
                     : policy_name == "lfru+drafts+prefetch" ? 2
                                                             : 0;
  if (drafts) base = "lfru";
  auto policy = belady ? nullptr : make_policy(base);
  if (!belady && !policy) return make_error("unknown policy " + policy_name);
  if (!belady && horizon < 0 && !drafts) return simulate_cache(t, slots, *policy);
  // Belady and the horizon see the coming accesses, which the Cache cannot: their own replay,
  // in the Cache's order of events (each request's resident experts first, then its misses, its
  // experts pinned until it ends).
  const size_t keys = size_t{t.n_layers} * t.n_experts;
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  // The last record the horizon policy sees from each record: the end of the step H steps on.
  std::vector<uint64_t> horizon_end(t.records.size(), 0);
  std::vector<uint64_t> step(t.records.size(), 0), step_end;  // each record's step; its end
  for (size_t i = 0; i < t.records.size(); ++i) {
    step[i] = i == 0 ? 0 : step[i - 1] + (t.records[i].layer < t.records[i - 1].layer);
    if (step[i] == step_end.size()) step_end.push_back(i);
    step_end[step[i]] = i;
  }
  if (horizon >= 0) {
    for (size_t i = 0; i < t.records.size(); ++i)
      horizon_end[i] = step_end[std::min<uint64_t>(step[i] + static_cast<uint64_t>(horizon),
                                                   step_end.size() - 1)];
  }
  // Belady and the horizon policies need each access's next use of the same expert.
  std::vector<std::vector<uint64_t>> next_use(t.records.size());
  {
    std::vector<uint64_t> upcoming(keys, kNever);
    for (size_t i = t.records.size(); i-- > 0;) {
      const auto& r = t.records[i];
      for (uint32_t e : r.experts) {
        next_use[i].push_back(upcoming[size_t{r.layer} * t.n_experts + e]);
        upcoming[size_t{r.layer} * t.n_experts + e] = i;
      }
    }
  }
  struct Slot {
    int64_t key = -1;
    uint64_t last_access = 0, inserted = 0, next = kNever;
    bool pinned = false, prefetched = false;
  };
  // lfru+drafts: the step each expert was last hinted in, until it is acquired.
  std::vector<uint64_t> hinted(drafts ? keys : 0, kNever);
  std::vector<Slot> s(slots);
  std::vector<int32_t> where(keys, -1);
  std::vector<uint32_t> freq(keys, 0);
  std::vector<uint32_t> free_list;
  for (uint32_t i = slots; i > 0; --i) free_list.push_back(i - 1);
  uint64_t clock = 0, accesses = 0;
  SimResult res;
  auto touch = [&](uint32_t i) {
    s[i].last_access = ++clock;
    ++freq[s[i].key];
    if (policy && policy->wants_aging(++accesses, slots))
      for (auto& f : freq) f /= 2;
  };
  auto view = [&](const Slot& x) { return SlotView{x.last_access, x.inserted, freq[x.key], 0.0}; };
  auto marked = [&](size_t key, size_t ri) { return drafts && hinted[key] == step[ri]; };
  // The slot to evict for record ri (-1: none); spare: never one the step's hints named.
  auto victim = [&](size_t ri, bool spare) {
    int64_t best = -1;
    for (uint32_t j = 0; j < slots; ++j) {
      if (s[j].pinned || (spare && marked(size_t(s[j].key), ri))) continue;
      bool better;
      if (best < 0)
        better = true;
      else if (belady)
        better = s[j].next > s[best].next;
      else if (drafts && marked(size_t(s[j].key), ri) != marked(size_t(s[best].key), ri))
        better = marked(size_t(s[best].key), ri);  // one was hinted for this step: keep it
      else if (horizon >= 0 && (s[j].next <= horizon_end[ri]) != (s[best].next <= horizon_end[ri]))
        better = s[best].next <= horizon_end[ri];  // one is used within the horizon: keep it
      else if (horizon >= 0 && s[j].next <= horizon_end[ri])
        better = s[j].next > s[best].next;  // both are: the farther use goes
      else
        better = policy->before(view(s[j]), view(s[best]));
      if (better) best = j;
    }
    return best;
  };
  size_t hi = 0;
  for (size_t ri = 0; ri < t.records.size(); ++ri) {
    const auto& r = t.records[ri];
    if (r.experts.size() > slots)
      return make_error("a request of " + std::to_string(r.experts.size()) + " experts exceeds " +
                        std::to_string(slots) + " slots");
    // The hints sent since the last acquire: marked for this step; +prefetch reads them into
    // free slots or in place of an expert no hint named.
    for (; drafts && hi < t.hints.size() && t.hints[hi].before <= ri; ++hi)
      for (uint32_t e : t.hints[hi].experts) {
        const size_t key = size_t{t.hints[hi].layer} * t.n_experts + e;
        hinted[key] = step[ri];
        if (drafts < 2 || where[key] >= 0) continue;
        int64_t i;
        if (!free_list.empty()) {
          i = free_list.back();
          free_list.pop_back();
        } else {
          i = victim(ri, /*spare=*/true);
          if (i < 0) continue;
          where[s[i].key] = -1;
          ++res.evictions;
        }
        s[i] = Slot{static_cast<int64_t>(key), ++clock, clock, kNever, false, true};
        where[key] = static_cast<int32_t>(i);
        ++res.prefetch_reads;
      }
    std::vector<uint32_t> pinned;
    for (size_t k = 0; k < r.experts.size(); ++k) {  // resident first, as Cache::grant
      size_t key = size_t{r.layer} * t.n_experts + r.experts[k];
      if (where[key] < 0) continue;
      uint32_t i = static_cast<uint32_t>(where[key]);
      ++res.hits;
      if (s[i].prefetched) ++res.prefetch_used, s[i].prefetched = false;
      s[i].pinned = true;
      s[i].next = next_use[ri][k];
      pinned.push_back(i);
      touch(i);
    }
    for (size_t k = 0; k < r.experts.size(); ++k) {
      size_t key = size_t{r.layer} * t.n_experts + r.experts[k];
      if (where[key] >= 0) continue;
      ++res.misses;
      uint32_t i;
      if (!free_list.empty()) {
        i = free_list.back();
        free_list.pop_back();
      } else {
        const int64_t best = victim(ri, /*spare=*/false);
        if (best < 0) return make_error("no evictable slot");
        i = static_cast<uint32_t>(best);
        where[s[i].key] = -1;
        ++res.evictions;
      }
      s[i] = Slot{static_cast<int64_t>(key), ++clock, clock, next_use[ri][k], true, false};
      where[key] = static_cast<int32_t>(i);
      pinned.push_back(i);
      touch(i);
    }
    for (uint32_t i : pinned) s[i].pinned = false;
    if (drafts)  // acquired: the hint is spent
      for (uint32_t e : r.experts) hinted[size_t{r.layer} * t.n_experts + e] = kNever;
  }
  return res;
}

}  // namespace expertd::daemon
