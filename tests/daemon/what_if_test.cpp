// The what-if ring and its replay (daemon/what_if.h) in-process: what falls out of the ring, the
// sizes replayed, and the replay against the simulator it wraps.
#include "daemon/what_if.h"

#include <gtest/gtest.h>

#include <thread>

#include "daemon/trace_sim.h"

using namespace expertd::daemon;

namespace {

WhatIfResult wait_replay(WhatIf& w) {
  for (int i = 0; i < 500; ++i) {
    WhatIfResult r = w.poll();
    if (!r.rows.empty() && !w.running()) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "no replay";
  return {};
}

}  // namespace

TEST(WhatIf, ReplaysTheWindowAtFourSizes) {
  WhatIf w({2, 16, 4, 1u << 20, "lru", 1024}, nullptr);
  EXPECT_TRUE(w.poll().rows.empty());  // nothing recorded: no replay
  EXPECT_FALSE(w.running());
  Trace t{2, 16, {}};
  for (uint32_t i = 0; i < 60; ++i) {
    const std::vector<uint32_t> ids = {i % 7, 7 + (i * 3 + 1) % 9};
    w.record(1, i % 2, ids);
    t.records.push_back({0, 1, i % 2, ids});
  }
  WhatIfResult r = wait_replay(w);
  EXPECT_EQ(r.accesses, 120u);
  ASSERT_EQ(r.rows.size(), 4u);
  const uint32_t slots[] = {2, 4, 8, 16};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.rows[i].slots, slots[i]);
    EXPECT_EQ(r.rows[i].cache_mib, slots[i]);  // 1 MiB slots
    auto sim = simulate(t, slots[i], "lru");
    ASSERT_TRUE(sim);
    EXPECT_DOUBLE_EQ(r.rows[i].hit_rate, sim->hit_rate());
    if (i > 0) {
      EXPECT_GE(r.rows[i].hit_rate, r.rows[i - 1].hit_rate);  // LRU is a stack policy
    }
  }
  // Nothing new: the same replay, no worker started.
  EXPECT_EQ(w.poll().at, r.at);
  EXPECT_FALSE(w.running());
}

TEST(WhatIf, TheRingKeepsTheNewestAccessesAndDropsACutAcquire) {
  WhatIf w({1, 64, 8, 4096, "lru", 10}, nullptr);
  for (uint32_t i = 0; i < 7; ++i) {
    const std::vector<uint32_t> ids = {i, i + 10, i + 20};  // 21 accesses into a ring of 10
    w.record(1, 0, ids);
  }
  // The newest 10 accesses: the last three acquires (9) and the tail of the one before, which is
  // left out of the replay.
  WhatIfResult r = wait_replay(w);
  EXPECT_EQ(r.accesses, 9u);
  ASSERT_FALSE(r.rows.empty());
  EXPECT_EQ(r.rows.front().slots, 4u);
  EXPECT_DOUBLE_EQ(r.rows.front().hit_rate, 0.0);  // every expert new
}

TEST(WhatIf, SizesStopWhereEveryExpertFits) {
  WhatIf w({1, 8, 4, 4096, "lfru", 64}, nullptr);
  const std::vector<uint32_t> ids = {1, 2};
  w.record(1, 0, ids);
  WhatIfResult r = wait_replay(w);
  ASSERT_EQ(r.rows.size(), 3u);  // 2, 4, 8: 16 would be more slots than experts
  EXPECT_EQ(r.rows.back().slots, 8u);
}

TEST(WhatIf, ARequestLargerThanASizeLeavesThatRowEmpty) {
  WhatIf w({1, 32, 4, 4096, "lru", 64}, nullptr);
  const std::vector<uint32_t> ids = {1, 2, 3};  // 3 experts in one acquire: 2 slots cannot hold it
  w.record(1, 0, ids);
  WhatIfResult r = wait_replay(w);
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_LT(r.rows[0].hit_rate, 0);
  EXPECT_GE(r.rows[1].hit_rate, 0);
}
