#include "daemon/stats.h"

#include "daemon/policy.h"
#include "test_util.h"

using namespace expertd::daemon;

TEST(Histogram, PercentilesBoundTheSamples) {
  Histogram h;
  for (uint64_t i = 1; i <= 1000; ++i) h.record(i);
  EXPECT_EQ(h.count(), 1000u);
  EXPECT_EQ(h.max(), 1000u);
  // Buckets are 1/8 of a power of two wide: the estimate is within 12.5% above the true value.
  for (double p : {50.0, 90.0, 99.0}) {
    double truth = p * 10;
    EXPECT_GE(h.percentile(p), truth);
    EXPECT_LE(h.percentile(p), truth * 1.125 + 1);
  }
  h.reset();
  EXPECT_EQ(h.percentile(50), 0u);
}

TEST(Policy, RanksVictimsAsNamed) {
  auto lru = make_policy("lru"), lfu = make_policy("lfu"), lfru = make_policy("lfru");
  ASSERT_TRUE(lru && lfu && lfru);
  EXPECT_EQ(make_policy("belady-online"), nullptr);
  SlotView old_hot{1, 1, 10}, new_cold{5, 4, 1};
  EXPECT_TRUE(lru->before(old_hot, new_cold));  // least recent goes first
  EXPECT_TRUE(lfu->before(new_cold, old_hot));  // least frequent goes first
  EXPECT_TRUE(lfru->before(new_cold, old_hot));
  SlotView a{3, 1, 2}, b{7, 2, 2};  // equal frequency: lfru falls back to recency
  EXPECT_TRUE(lfru->before(a, b));
  EXPECT_TRUE(lfu->before(a, b));  // lfu: older load first
  EXPECT_TRUE(lfru->wants_aging(80, 10));
  EXPECT_FALSE(lru->wants_aging(80, 10));
}
