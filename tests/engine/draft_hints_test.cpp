// Draft hints (engine/draft_hints.h) on the bundled model (model/kjv-moe-q8_0.gguf): what is
// hinted is exactly the copied positions' routing, and through a real expertd the hints and the
// drafts' counts reach the daemon (expertctl stats, the trace) while the greedy text stays the
// text without them.
#include "engine/draft_hints.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "daemon/trace_sim.h"
#include "engine/engine.h"
#include "engine/speculative.h"
#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"
#include "pack/builder.h"
#include "test_util.h"

using namespace expertd::test;

namespace {

std::string bundled() {
  return std::string(EXPERTD_SOURCE_DIR) + "/model/kjv-moe-q8_0.gguf";
}

// The model's own experts, and every hint kept: [layer] -> the experts hinted, in order.
class RecordingSource final : public engine::ExpertSource {
 public:
  explicit RecordingSource(const engine::Model& m) : local_(engine::make_local_source(m)) {}
  std::string name() const override { return "recording"; }
  expertd::Status for_each_batch(int layer, std::span<const uint32_t> experts,
                                 const BatchFn& fn) override {
    return local_->for_each_batch(layer, experts, fn);
  }
  bool wants_hints() const override { return true; }
  void prefetch(int layer, std::span<const uint32_t> experts) override {
    hints[layer].push_back({experts.begin(), experts.end()});
  }
  std::map<int, std::vector<std::vector<uint32_t>>> hints;

 private:
  std::unique_ptr<engine::ExpertSource> local_;
};

const char* kPassage =
    "And God said, Let there be light: and there was light. And God saw the light, that it was "
    "good: and God divided the light from the darkness.";

}  // namespace

// The pending token's twin: the end of the latest earlier occurrence of the longest recurring
// suffix, down to the token alone.
TEST(DraftHints, PendingTwinIsTheLongestSuffixsLatestEarlierEnd) {
  EXPECT_EQ(engine::pending_twin(std::vector<int32_t>{1, 2, 3, 9, 1, 2, 3}), 2);
  EXPECT_EQ(engine::pending_twin(std::vector<int32_t>{7, 3, 1, 2, 3, 9, 1, 2, 3}), 4);  // latest
  EXPECT_EQ(engine::pending_twin(std::vector<int32_t>{5, 1, 4, 5}), 0);  // the token alone
  EXPECT_EQ(engine::pending_twin(std::vector<int32_t>{1, 2, 3}), -1);
  EXPECT_EQ(engine::pending_twin(std::vector<int32_t>{1}), -1);
}

// RouteHistory keeps each position's routing from the evals and hints, per MoE layer, the union
// of the experts positions [from, from + n) routed to; a cut forgets the positions past it.
TEST(DraftHints, HintsAreTheCopiedPositionsRouting) {
  auto f = gguf::Model::open(bundled());
  ASSERT_TRUE(f) << f.error().message;
  auto m = engine::Model::load(*f);
  ASSERT_TRUE(m) << m.error().message;
  auto tok = engine::Tokenizer::load(*f);
  ASSERT_TRUE(tok);
  const auto ids = tok->encode(std::string(kPassage) + " " + kPassage, true, true);
  RecordingSource src(*m);
  engine::Engine e(*m, src, 2, 256);
  std::vector<float> lg;
  ASSERT_TRUE(e.eval(std::span<const int32_t>(ids).first(20), false, lg));
  engine::RouteHistory h(m->hp.n_layer, e.n_ctx());
  h.record(e, 0, 0, 20);
  const auto first = e.routes();  // [layer][token]
  ASSERT_TRUE(e.eval(std::span<const int32_t>(ids).subspan(20, 5), true, lg));
  h.record(e, 20, 0, 5);
  const auto second = e.routes();
  EXPECT_EQ(h.known(), 25);
  src.hints.clear();
  const size_t n = h.hint(e, 18, 4);  // positions 18, 19 (first eval) and 20, 21 (second)
  size_t want_total = 0;
  int moe_layers = 0;
  for (int il = 0; il < m->hp.n_layer; ++il) {
    if (first[size_t(il)].empty()) {
      EXPECT_EQ(src.hints.count(il), 0u) << il;  // a dense layer
      continue;
    }
    ++moe_layers;
    std::set<uint32_t> want;
    for (size_t t : {18u, 19u})
      want.insert(first[il][t].experts.begin(), first[il][t].experts.end());
    for (size_t t : {0u, 1u})
      want.insert(second[il][t].experts.begin(), second[il][t].experts.end());
    ASSERT_EQ(src.hints[il].size(), 1u) << il;
    EXPECT_EQ(src.hints[il][0], std::vector<uint32_t>(want.begin(), want.end())) << il;
    want_total += want.size();
  }
  EXPECT_GT(moe_layers, 0);
  EXPECT_EQ(n, want_total);
  // Positions past the history or never recorded are skipped; a cut forgets.
  src.hints.clear();
  EXPECT_EQ(h.hint(e, 25, 4), 0u);
  h.cut(19);
  EXPECT_EQ(h.known(), 19);
  size_t one = 0;
  for (int il = 0; il < m->hp.n_layer; ++il)
    if (!first[size_t(il)].empty()) one += first[il][18].experts.size();
  EXPECT_EQ(h.hint(e, 18, 4), one);
  // A resumed prefix: positions never recorded are unknown, not an error.
  engine::RouteHistory g(m->hp.n_layer, e.n_ctx());
  g.record(e, 30, 0, 2);  // the last eval's first two rows as positions 30 and 31
  EXPECT_EQ(g.known(), 32);
  EXPECT_EQ(g.hint(e, 0, 30), 0u);
  size_t row0 = 0;
  for (int il = 0; il < m->hp.n_layer; ++il)
    if (!second[size_t(il)].empty()) row0 += second[il][0].experts.size();
  EXPECT_EQ(g.hint(e, 28, 3), row0);
}

// expert-run --speculative ngram through a real expertd: the same greedy text with and without
// draft hints (on by default), the hints counted on --verbose and in the trace (as hint records),
// and the drafts' counts in expertctl stats equal to --verbose's.
TEST(DraftHints, ExpertRunHintsDraftsAndReportsAcceptanceToExpertd) {
  TempDir d;
  fs::copy_file(bundled(), d / "kjv.gguf");
  expertd::pack::BuildOptions o;
  o.model_path = d / "kjv.gguf";
  o.progress = false;
  auto rep = expertd::pack::build_pack(o);
  ASSERT_TRUE(rep) << rep.error().message;
  const std::string trace = d / "t.trace";
  Daemon daemon(rep->manifest_path, d / "s.sock",
                {"--cache-slots", "32", "--clients-max", "3", "--max-experts-per-request", "8",
                 "--trace-path", trace});
  std::string log;
  ASSERT_TRUE(daemon.start(&log)) << log;
  write_file(d / "p.txt", std::string(kPassage) + "\n\nWrite the passage above again.\n\n" +
                              std::string(kPassage).substr(0, 60));
  const std::string gen = bin("engine/expert-run") + " generate --model " + rep->core_path +
                          " --socket " + d / "s.sock" + " --prompt-file " + d / "p.txt" +
                          " -n 60 --temp 0 --threads 2 --speculative ngram --draft-max 8";
  const std::string ctl = bin("client/expertctl") + " --socket " + d / "s.sock";
  auto off = run(gen + " --no-draft-hints 2>/dev/null");
  ASSERT_EQ(off.first, 0) << off.second;
  auto j = nlohmann::json::parse(run(ctl + " stats --json").second);
  EXPECT_EQ(j["prefetch_issued"].get<double>() + j["prefetch_rejected"].get<double>() +
                j["prefetch_dropped"].get<double>(),
            0);  // no hints without them
  ASSERT_EQ(run(ctl + " reset-stats").first, 0);
  auto on = run("(" + gen + " --verbose >" + d / "out.txt" + ")");  // stderr alone returned
  ASSERT_EQ(on.first, 0) << on.second;
  EXPECT_EQ(read_file(d / "out.txt"), off.second);  // hints never change the math
  const std::string err = on.second;
  const size_t at = err.find("draft hints: ");
  ASSERT_NE(at, std::string::npos) << err;
  EXPECT_GT(std::stoull(err.substr(at + 13)), 0u) << err;
  unsigned long long evals = 0, drafted = 0, accepted = 0;
  const size_t sp = err.find("speculative ngram: ");
  ASSERT_NE(sp, std::string::npos) << err;
  ASSERT_EQ(std::sscanf(err.c_str() + sp, "speculative ngram: %llu evals", &evals), 1) << err;
  const size_t dr = err.find("; ", sp);
  ASSERT_EQ(std::sscanf(err.c_str() + dr, "; %llu drafted, %llu accepted", &drafted, &accepted), 2)
      << err;
  EXPECT_GT(drafted, 0u);
  j = nlohmann::json::parse(run(ctl + " stats --json").second);
  EXPECT_EQ(j["draft_tokens"].get<double>(), double(drafted));
  EXPECT_EQ(j["draft_accepted"].get<double>(), double(accepted));
  EXPECT_GT(j["prefetch_issued"].get<double>() + j["prefetch_rejected"].get<double>() +
                j["prefetch_dropped"].get<double>(),
            0);
  EXPECT_NE(run(ctl + " stats").second.find("draft_acceptance"), std::string::npos);
  ASSERT_EQ(daemon.stop(), 0);
  auto t = expertd::daemon::read_trace(trace);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_GT(t->hints.size(), 0u);
  auto with = expertd::daemon::simulate(*t, 32, "lfru+hints");
  ASSERT_TRUE(with) << with.error().message;
  EXPECT_GT(with->prefetch_reads, 0u);
}
