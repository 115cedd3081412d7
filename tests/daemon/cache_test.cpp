// The Cache in process (daemon/cache_sim.h: slots without memory, reads completed when the test
// says, the sink's messages kept): grants, waves, eviction order, failed reads and checksums,
// without a daemon, a drive or a socket. The daemon tests check the same paths end to end.
#include "daemon/cache.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "daemon/cache_sim.h"
#include "daemon/policy.h"
#include "proto/frame.h"

using namespace expertd;
using namespace expertd::daemon;

namespace {

struct Harness {
  pack::Manifest m;
  sim::NullArena arena;
  std::unique_ptr<EvictionPolicy> policy;
  sim::RecordingSink sink;
  sim::QueuedReader reader;
  Cache cache;
  Harness(uint32_t slots, CacheConfig cfg, const char* policy_name = "lru", uint32_t layers = 2,
          uint32_t experts = 16)
      : m(sim::manifest(layers, experts)),
        arena(slots, 4096),
        policy(make_policy(policy_name)),
        cache(m, arena, *policy, sink, cfg) {
    cache.set_io(&reader);
  }
  // Acquires and completes the reads; the lease id.
  uint64_t acquire(ClientId c, uint32_t layer, std::vector<uint32_t> experts) {
    cache.acquire(c, ++request, layer, experts);
    reader.complete_all(cache);
    EXPECT_TRUE(sink.failures.empty()) << sink.failures.back().message;
    EXPECT_FALSE(sink.grants.empty());
    return sink.grants.empty() ? 0 : sink.grants.back().lease_id;
  }
  uint64_t request = 0;
};

CacheConfig unchecked() {
  CacheConfig c;
  c.verify_checksums = false;
  return c;
}

}  // namespace

// A layer of 10 experts on a budget of 4 pins: the first wave is 4 slots, every miss of the layer
// is read at once, the later experts come in their Ready as done() frees pins, never more than 4
// pinned; then they are hits.
TEST(CacheInProcess, ALayerLargerThanThePinBudgetComesInWaves) {
  CacheConfig cfg = unchecked();
  cfg.max_experts_per_request = 4;
  Harness h(12, cfg);
  std::vector<uint32_t> experts = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  h.cache.acquire(1, 1, 0, experts);
  ASSERT_EQ(h.sink.grants.size(), 1u);
  const auto& g = h.sink.grants[0];
  EXPECT_EQ(
      std::count_if(g.slots.begin(), g.slots.end(), [](uint32_t s) { return s != proto::kNoSlot; }),
      4);
  EXPECT_EQ(h.reader.pending(), 10u) << "every miss of the layer is read at once";
  h.reader.complete_all(h.cache);
  EXPECT_EQ(h.sink.ready.size(), 4u);  // the first wave's
  EXPECT_EQ(h.cache.gauges().slots_pinned, 4u);
  for (uint32_t first : {0u, 4u}) {
    std::vector<uint32_t> done;
    for (const auto& r : h.sink.ready)
      if (r.index >= first && r.index < first + 4) done.push_back(r.index);
    ASSERT_EQ(done.size(), 4u);
    h.cache.done(1, 2, g.lease_id, done);
    ASSERT_TRUE(h.sink.failures.empty()) << h.sink.failures.back().message;
    EXPECT_LE(h.cache.gauges().slots_pinned, 4u);
  }
  EXPECT_EQ(h.sink.ready.size(), 10u);
  for (const auto& r : h.sink.ready) {
    EXPECT_EQ(r.code, ErrorCode::None);
    EXPECT_NE(r.slot, proto::kNoSlot);
  }
  h.cache.release(1, 3, g.lease_id);
  h.acquire(1, 0, {9, 6, 8, 7});  // the later waves' experts stayed: hits, no read
  EXPECT_EQ(h.reader.stats().reads_submitted, 10u);
  EXPECT_EQ(h.cache.stats().c.cache_hits, 4u);
  EXPECT_EQ(h.cache.stats().c.cache_misses, 10u);
}

// LRU on 4 slots: the least recently acquired expert goes first; a pinned one never does.
TEST(CacheInProcess, EvictionFollowsThePolicyAndSparesPins) {
  Harness h(4, unchecked());
  uint64_t l = h.acquire(1, 0, {0, 1});
  h.cache.release(1, ++h.request, l);
  l = h.acquire(1, 0, {2, 3});
  h.cache.release(1, ++h.request, l);
  l = h.acquire(1, 0, {0});  // 0 is now more recent than 1
  h.cache.release(1, ++h.request, l);
  const uint64_t held = h.acquire(2, 0, {2});  // client 2 keeps 2 pinned
  l = h.acquire(1, 1, {5, 6});                 // two victims: 1 (oldest), then 3 (2 is pinned)
  h.cache.release(1, ++h.request, l);
  EXPECT_EQ(h.cache.slot_of(0, 1), -1);
  EXPECT_EQ(h.cache.slot_of(0, 3), -1);
  EXPECT_GE(h.cache.slot_of(0, 0), 0);
  EXPECT_GE(h.cache.slot_of(0, 2), 0);
  EXPECT_EQ(h.cache.stats().c.cache_evictions, 2u);
  h.cache.release(2, ++h.request, held);
}

// A read that fails and a block whose checksum is wrong are errors for the waiting engine,
// counted, and leave no expert behind: the next acquire reads again.
TEST(CacheInProcess, FailedReadsAndBadChecksumsAreErrorsNotExperts) {
  CacheConfig cfg;  // checksums on: the manifest's say zeros hash to 0, which they do not
  Harness h(4, cfg);
  h.cache.acquire(1, 1, 0, std::vector<uint32_t>{3});
  ASSERT_EQ(h.reader.pending(), 1u);
  h.reader.complete_all(h.cache);
  ASSERT_EQ(h.sink.ready.size(), 1u);
  EXPECT_EQ(h.sink.ready[0].code, ErrorCode::ChecksumError);
  EXPECT_EQ(h.cache.stats().c.checksum_errors, 1u);
  EXPECT_EQ(h.cache.stats().c.io_errors, 1u);  // a read that failed its check failed
  EXPECT_EQ(h.cache.slot_of(0, 3), -1);
  h.cache.release(1, 2, h.sink.grants.back().lease_id);
  // The right checksum: ready.
  h.m.layers[0].checksums[3] = XXH3_64bits(std::vector<uint8_t>(4096).data(), 4096);
  h.cache.acquire(1, 3, 0, std::vector<uint32_t>{3});
  h.reader.complete_all(h.cache);
  ASSERT_EQ(h.sink.ready.size(), 2u);
  EXPECT_EQ(h.sink.ready[1].code, ErrorCode::None);
  h.cache.release(1, 4, h.sink.grants.back().lease_id);
  // A read error from the drive.
  h.cache.acquire(1, 5, 1, std::vector<uint32_t>{7});
  ASSERT_EQ(h.reader.pending(), 1u);
  h.reader.fail_next(h.cache, expertd::make_error("EIO"));
  ASSERT_EQ(h.sink.ready.size(), 3u);
  EXPECT_EQ(h.sink.ready[2].code, ErrorCode::IoError);
  EXPECT_EQ(h.cache.stats().c.io_errors, 2u);
  EXPECT_EQ(h.cache.stats().c.checksum_errors, 1u);
  EXPECT_EQ(h.cache.slot_of(1, 7), -1);
}

namespace {

// A cuda arena's shape without a GPU: VRAM slots that hold no bytes and a host tier whose copies
// succeed at once, so the residency map's letters can be checked in process.
class TieredArena final : public SlotArena {
 public:
  TieredArena(uint32_t slots, uint32_t host_slots) : slots_(slots), host_(host_slots) {}
  std::string kind() const override { return "cuda"; }
  uint32_t slot_count() const override { return slots_; }
  uint64_t slot_bytes() const override { return 4096; }
  uint8_t* read_target(uint32_t) override { return scratch_.data(); }
  void publish(uint32_t, uint64_t, std::function<void(Status)> done) override { done({}); }
  uint32_t host_slot_count() const override { return host_; }
  Status demote(uint32_t, uint32_t, uint64_t) override { return {}; }
  Status promote(uint32_t, uint32_t, uint64_t) override { return {}; }

 private:
  uint32_t slots_, host_;
  std::vector<uint8_t> scratch_ = std::vector<uint8_t>(4096);
};

std::string residency_of(const Cache& c, uint32_t layer, uint32_t experts) {
  std::vector<uint8_t> all(size_t{2} * experts);
  c.residency(all);
  return std::string(all.begin() + layer * experts, all.begin() + (layer + 1) * experts);
}

}  // namespace

// The dashboards' residency map and per-expert counters (ExpertsRequest) through a read, an
// eviction into the host tier and a copy back up: 'L' while read, 'V' in VRAM, 'H' in the tier.
TEST(CacheInProcess, ResidencyAndPerExpertCountersFollowTheTiers) {
  const pack::Manifest m = sim::manifest(2, 8);
  TieredArena arena(2, 4);
  auto policy = make_policy("lru");
  sim::RecordingSink sink;
  sim::QueuedReader reader;
  Cache cache(m, arena, *policy, sink, unchecked());
  cache.set_io(&reader);
  EXPECT_EQ(residency_of(cache, 0, 8), "........");
  cache.acquire(1, 1, 0, std::vector<uint32_t>{1, 2});
  EXPECT_EQ(residency_of(cache, 0, 8), ".LL.....");
  reader.complete_all(cache);
  EXPECT_EQ(residency_of(cache, 0, 8), ".VV.....");
  cache.release(1, 2, sink.grants.back().lease_id);
  cache.acquire(1, 3, 0, std::vector<uint32_t>{3, 4});  // evicts 1 and 2 into the host tier
  reader.complete_all(cache);
  EXPECT_EQ(residency_of(cache, 0, 8), ".HHVV...");
  cache.release(1, 4, sink.grants.back().lease_id);
  cache.acquire(1, 5, 0, std::vector<uint32_t>{1});  // copied up: a miss, no read
  EXPECT_EQ(reader.pending(), 0u);
  EXPECT_EQ(residency_of(cache, 0, 8)[1], 'V');
  EXPECT_EQ(residency_of(cache, 0, 8)[2], 'H');
  EXPECT_EQ(residency_of(cache, 1, 8), "........");
  cache.release(1, 6, sink.grants.back().lease_id);
  cache.acquire(1, 7, 0, std::vector<uint32_t>{1});  // a hit
  const Stats& st = cache.stats();
  EXPECT_EQ(st.expert_misses[1], 2u);
  EXPECT_EQ(st.expert_hits[1], 1u);
  EXPECT_EQ(st.expert_misses[3], 1u);
  EXPECT_EQ(st.expert_hits[3], 0u);
  EXPECT_EQ(st.expert_hits[8 + 1], 0u);  // layer 1 untouched
  EXPECT_EQ(st.c.cache_hits, 1u);
  EXPECT_EQ(st.c.cache_misses, 5u);
  cache.evict_all();  // the host tier too: a cold start
  cache.release(1, 8, sink.grants.back().lease_id);
  cache.evict_all();
  EXPECT_EQ(residency_of(cache, 0, 8), "........");
}
