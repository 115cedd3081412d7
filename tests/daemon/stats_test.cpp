#include "daemon/stats.h"

#include "daemon/affinity.h"
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

// The one Prometheus rendering of it (expert-serve's latencies): cumulative buckets at powers of
// four, exact at their edges, the sum and count in the metric's unit.
TEST(Histogram, PrometheusBucketsAreExactAtTheirEdges) {
  Histogram h;
  for (uint64_t v : {0, 3, 4, 15, 16, 1000, 5000000}) h.record(v);
  std::string out;
  h.render_prometheus(out, "x_seconds", "test", 6);
  EXPECT_NE(out.find("# TYPE x_seconds histogram\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.000003\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.000015\"} 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.000063\"} 5\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.001023\"} 6\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"4.194303\"} 6\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"16.777215\"} 7\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"+Inf\"} 7\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_sum 5.001038\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_count 7\n"), std::string::npos) << out;
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

TEST(Policy, AffinityRaisesWhatTheStepWillNeed) {
  auto aff = make_policy("lfru+affinity");
  ASSERT_TRUE(aff);
  EXPECT_TRUE(aff->wants_affinity());
  EXPECT_FALSE(make_policy("lfru")->wants_affinity());
  // One acquire less, but a 0.5 chance that the step in progress uses it (+4): kept.
  SlotView likely{1, 1, 2, 0.5}, unlikely{9, 2, 3, 0.0};
  EXPECT_TRUE(aff->before(unlikely, likely));
  EXPECT_TRUE(aff->wants_aging(80, 10));
}

// The model learns which experts of the next layers follow which: after steps where layer 0's
// expert 3 is followed by layer 1's expert 5 (and layer 0's expert 4 by 6), a step that used 3
// will likely use 5 and not 6; the table shrinks its reach under the budget.
TEST(Affinity, LearnsWhatFollowsWhatAcrossLayers) {
  Affinity a(3, 8);
  EXPECT_EQ(a.layers_ahead(), 2u);  // all the layers a 3-layer model has ahead
  for (int i = 0; i < 40; ++i) {
    const uint32_t c =
        static_cast<uint32_t>(i % 2);  // two clients, interleaved, each its own steps
    const uint32_t x = i % 4 < 2 ? 3 : 4;
    a.record(c, 0, std::vector<uint32_t>{x});
    a.record(c, 1, std::vector<uint32_t>{x + 2});
    a.record(c, 2, std::vector<uint32_t>{7});
  }
  a.record(0, 0, std::vector<uint32_t>{3});  // client 0 starts a step with expert 3
  EXPECT_EQ(a.step_layer(0), 0);
  EXPECT_GT(a.chance(0, 1, 5), 0.9);
  EXPECT_LT(a.chance(0, 1, 6), 0.1);
  EXPECT_GT(a.chance(0, 2, 7), 0.9);  // two layers ahead
  EXPECT_LT(a.chance(0, 1, 1), 0.1);  // never used
  EXPECT_EQ(a.step_layer(9), -1);
  EXPECT_NEAR(a.chance(9, 1, 5), 0.5, 0.05);  // a client with no step: the prior (half the steps)
  // Kimi-K3's 61 layers x 384 experts at 2 bytes per pair and layer ahead: one layer in 32 MiB.
  EXPECT_EQ(Affinity(61, 384).layers_ahead(), 1u);
  EXPECT_EQ(Affinity(12, 128).layers_ahead(), 4u);
}
