// The bundled model (model/kjv-moe-q8_0.gguf) writes text from its training vocabulary through a
// real expertd whose cache is smaller than the model, and greedy output is identical through
// the daemon and with --local.
#include <cctype>
#include <set>
#include <sstream>

#include "pack/builder.h"
#include "test_util.h"

using namespace expertd::test;

namespace {
std::string model_dir() {
  return std::string(EXPERTD_SOURCE_DIR) + "/model";
}
}  // namespace

TEST(BundledModel, WritesKjvWordsThroughExpertdAndMatchesLocal) {
  std::string model = model_dir() + "/kjv-moe-q8_0.gguf";
  ASSERT_TRUE(fs::exists(model)) << model;
  TempDir d;
  fs::copy_file(model, d / "kjv.gguf");
  expertd::pack::BuildOptions o;
  o.model_path = d / "kjv.gguf";
  o.progress = false;
  auto rep = expertd::pack::build_pack(o);
  ASSERT_TRUE(rep) << rep.error().message;
  // 40 slots for 4 layers x 32 experts: the cache is smaller than the model.
  Daemon daemon(rep->manifest_path, d / "s.sock",
                {"--cache-slots", "40", "--clients-max", "2", "--max-experts-per-request", "8"});
  std::string log;
  ASSERT_TRUE(daemon.start(&log)) << log;
  std::string run_bin = bin("engine/expert-run");
  std::string args = " --prompt 'And God said' -n 120 --temp 0 --threads 2 2>/dev/null";
  auto remote =
      run(run_bin + " generate --model " + rep->core_path + " --socket " + d / "s.sock" + args);
  auto local = run(run_bin + " generate --model " + d / "kjv.gguf" + " --local" + args);
  ASSERT_EQ(remote.first, 0) << remote.second;
  ASSERT_EQ(local.first, 0) << local.second;
  EXPECT_EQ(remote.second, local.second);
  std::set<std::string> vocab;
  std::stringstream vs(read_file(model_dir() + "/kjv-words.txt"));
  for (std::string w; vs >> w;) vocab.insert(w);
  ASSERT_GT(vocab.size(), 10000u);
  std::vector<std::string> words;
  std::string cur;
  for (char ch : remote.second + " ") {
    if (std::isalpha(static_cast<unsigned char>(ch))) {
      cur += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    } else if (!cur.empty()) {
      words.push_back(cur);
      cur.clear();
    }
  }
  ASSERT_GE(words.size(), 40u) << remote.second;
  size_t known = std::count_if(words.begin(), words.end(),
                               [&](const std::string& w) { return vocab.count(w); });
  EXPECT_GE(known * 10, words.size() * 9) << known << " of " << words.size() << " words known:\n"
                                          << remote.second;
  // Without --model, expert-run uses the bundled model.
  auto implicit =
      run(run_bin +
          " generate --local --prompt 'And God said' -n 120 --temp 0 --threads 2 2>/dev/null");
  EXPECT_EQ(implicit.second, local.second);
  auto stats = run(bin("client/expertctl") + " --socket " + d / "s.sock" + " stats --json");
  EXPECT_EQ(stats.second.find("\"cache_misses\":0,"), std::string::npos)
      << stats.second;  // misses really happen
}
