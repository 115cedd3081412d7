// Speculative decoding seen from expertd: engines' DraftReports summed per engine and in total
// (expertctl stats), and Prefetch hints in the trace replayed by the policy lab ("+hints").
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "daemon/fixture.h"
#include "daemon/trace_sim.h"

using namespace expertd;
using namespace expertd::test;

// Two engines report their drafts; expertctl stats shows the total (text, --json) and
// stats --experts each engine's; a report that keeps more than it drafted is refused.
TEST_F(DaemonTest, DraftReportsAreSummedPerEngineAndInTotal) {
  auto d = start({"--cache-slots", "8", "--clients-max", "4", "--max-experts-per-request", "2"});
  auto a = connect(), b = connect();
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->report_drafts(1, 8, 6));
  ASSERT_TRUE(a->report_drafts(2, 4, 1));
  ASSERT_TRUE(b->report_drafts(1, 8, 8));
  EXPECT_EQ(stat(*a, "client_errors"), 0);  // a round trip: every report before it was read
  ASSERT_TRUE(b->stats());
  EXPECT_EQ(stat(*a, "draft_steps"), 4);
  EXPECT_EQ(stat(*a, "draft_tokens"), 20);
  EXPECT_EQ(stat(*a, "draft_accepted"), 15);
  EXPECT_DOUBLE_EQ(stat(*a, "draft_acceptance"), 0.75);
  std::string ctl = bin("client/expertctl") + " --socket " + socket();
  auto [rc, out] = run(ctl + " stats --json");
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["draft_tokens"], 20);
  EXPECT_EQ(j["draft_accepted"], 15);
  EXPECT_DOUBLE_EQ(j["draft_acceptance"].get<double>(), 0.75);
  std::tie(rc, out) = run(ctl + " stats");
  EXPECT_NE(out.find("draft_acceptance"), std::string::npos) << out;
  std::tie(rc, out) = run(ctl + " stats --experts --json");
  ASSERT_EQ(rc, 0) << out;
  j = nlohmann::json::parse(out);
  std::vector<std::pair<uint64_t, uint64_t>> engines;
  for (const auto& e : j["engines"])
    if (e["kind"] == "engine") engines.push_back({e["drafted"], e["accepted"]});
  EXPECT_EQ(engines, (std::vector<std::pair<uint64_t, uint64_t>>{{12, 7}, {8, 8}}));
  std::tie(rc, out) = run(ctl + " stats --experts");
  EXPECT_NE(out.find("12 drafted, 7 accepted (58.3%)"), std::string::npos) << out;
  // More kept than drafted: an error for the sender, the counts unchanged.
  ASSERT_TRUE(a->report_drafts(1, 2, 3));
  ASSERT_TRUE(a->stats());
  auto err = a->take_async_error();
  ASSERT_TRUE(err);
  EXPECT_NE(err->find("accepted more drafts"), std::string::npos) << *err;
  EXPECT_EQ(stat(*a, "draft_tokens"), 20);
  // reset-stats zeroes the totals.
  std::tie(rc, out) = run(ctl + " reset-stats");
  EXPECT_EQ(stat(*a, "draft_tokens"), 0);
}

// Prefetch hints are trace records of their own (bit 15 of the layer); the lab's "lfru+hints"
// ("lfru+hints-spare" for --prefetch-admit spare) replays them through the Cache as the daemon
// took them and reproduces its hits and hint reads exactly (each hint's reads are let land
// before the next acquire, as the lab assumes); plain "lfru" on the same trace ignores them.
class HintsTest : public DaemonTest {
 protected:
  void replay_with_hints(const std::string& admit);
};

TEST_F(HintsTest, TraceHintsReplayedByTheLabReproduceTheDaemon) {
  for (const std::string admit : {"colder", "spare"}) {
    SCOPED_TRACE(admit);
    replay_with_hints(admit);
  }
}

void HintsTest::replay_with_hints(const std::string& admit) {
  std::string trace = local_ / ("hints-" + admit + ".trace");
  auto d =
      start({"--cache-slots", "8", "--policy", "lfru", "--clients-max", "1",
             "--max-experts-per-request", "3", "--trace-path", trace, "--prefetch-admit", admit});
  auto c = connect();
  std::mt19937 rng(7);
  auto pick = [&](size_t n) {
    std::vector<uint32_t> ids;
    while (ids.size() < n) {
      uint32_t e = std::min<uint32_t>(
          kExperts - 1,
          static_cast<uint32_t>(std::exp(std::uniform_real_distribution<>(0, 3.4)(rng))) - 1);
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    return ids;
  };
  uint64_t hinted = 0;
  for (int i = 0; i < 200; ++i) {
    if (i % 3 == 0) {
      ASSERT_TRUE(c->prefetch(uint32_t(i / 3) % kLayers, pick(2)));
      ++hinted;
      // The hint's reads land before the next acquire (what the lab assumes).
      for (int w = 0; w < 400 && (stat(*c, "slots_loading") > 0); ++w)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    use(*c, uint32_t(i) % kLayers, pick(1 + rng() % 3));
  }
  const double hits = stat(*c, "cache_hits"), issued = stat(*c, "prefetch_issued");
  EXPECT_GT(issued, 0);
  c.reset();
  ASSERT_EQ(d->stop(), 0);
  auto t = daemon::read_trace(trace);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->records.size(), 200u);
  EXPECT_EQ(t->hints.size(), hinted);
  auto sim = daemon::simulate(*t, 8, admit == "spare" ? "lfru+hints-spare" : "lfru+hints");
  ASSERT_TRUE(sim) << sim.error().message;
  EXPECT_EQ(sim->hits, hits);
  EXPECT_EQ(sim->prefetch_reads, issued);
  auto plain = daemon::simulate(*t, 8, "lfru");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->prefetch_reads, 0u);
  EXPECT_EQ(plain->hits + plain->misses, sim->hits + sim->misses);
  EXPECT_TRUE(daemon::simulate(*t, 8, "lfru+hints-always"));
  // The hints as knowledge of their step: no reads of their own, never past the optimum.
  auto drafts = daemon::simulate(*t, 8, "lfru+drafts");
  auto opt = daemon::simulate(*t, 8, "belady");
  ASSERT_TRUE(drafts && opt);
  EXPECT_EQ(drafts->prefetch_reads, 0u);
  EXPECT_EQ(drafts->hits + drafts->misses, opt->hits + opt->misses);
  EXPECT_LE(drafts->hits, opt->hits);
  auto pre = daemon::simulate(*t, 8, "lfru+drafts+prefetch");
  ASSERT_TRUE(pre);
  EXPECT_GT(pre->prefetch_reads, 0u);
  EXPECT_LE(pre->prefetch_used, pre->prefetch_reads);
  EXPECT_FALSE(daemon::simulate(*t, 8, "nonsense+hints"));
}

// --prefetch-admit spare: an expert hinted for the current step is spared by a demand miss that
// needs a slot (a later layer's hint survives the earlier layers' reads); with always, the
// policy's victim is the hinted expert itself (never acquired yet: the coldest), read for nothing.
TEST_F(HintsTest, SpareKeepsTheStepsHintedExpertsUntilTheirLayerComes) {
  for (const std::string admit : {"always", "spare"}) {
    SCOPED_TRACE(admit);
    auto d = start({"--cache-slots", "4", "--policy", "lfru", "--clients-max", "1",
                    "--max-experts-per-request", "2", "--prefetch-admit", admit});
    auto c = connect();
    use(*c, 0, {0, 1});
    use(*c, 1, {2, 3});                                     // full
    use(*c, 0, {0});                                        // a new step
    ASSERT_TRUE(c->prefetch(1, std::vector<uint32_t>{5}));  // in place of (0, 1)
    for (int w = 0; w < 400 && stat(*c, "prefetch_issued") + stat(*c, "slots_loading") != 1; ++w)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_EQ(stat(*c, "prefetch_issued"), 1);
    use(*c, 0, {6});  // a miss of the same step: needs a slot
    const double hits = stat(*c, "cache_hits");
    use(*c, 1, {5});
    if (admit == "spare") {
      EXPECT_EQ(stat(*c, "cache_hits"), hits + 1);
      EXPECT_EQ(stat(*c, "prefetch_used"), 1);
    } else {
      EXPECT_EQ(stat(*c, "cache_hits"), hits);
      EXPECT_EQ(stat(*c, "prefetch_wasted"), 1);
    }
    c.reset();
    ASSERT_EQ(d->stop(), 0);
  }
}
