// The page's server side with real parts: the page's files read from the source tree (and a
// directory missing one refused), the dashboard's snapshot shared by callers within its interval
// and made again after it, its viewers capped, and the routers' counts per layer and expert in it.
#include "serve/dashboard.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "serve/web.h"
#include "test_util.h"

using namespace expertd;
using namespace expertd::serve;

TEST(WebFiles, ServesThePageFromTheSourceTree) {
  auto w = WebFiles::load(std::string(EXPERTD_SOURCE_DIR) + "/serve/web");
  ASSERT_TRUE(w) << w.error().message;
  const WebFile* index = w->get("/");
  ASSERT_NE(index, nullptr);
  EXPECT_NE(index->body.find("<canvas id=\"heat\""), std::string::npos);
  EXPECT_EQ(index->content_type, "text/html; charset=utf-8");
  EXPECT_EQ(w->get("/index.html"), index);
  ASSERT_NE(w->get("/web/dashboard.js"), nullptr);
  EXPECT_EQ(w->get("/web/dashboard.js")->content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(w->get("/web/../CMakeLists.txt"), nullptr);
  EXPECT_EQ(w->get("/web/nope.js"), nullptr);
}

TEST(WebFiles, ADirectoryWithoutThePageIsRefused) {
  const auto dir = std::filesystem::temp_directory_path() / "web-files-test-empty";
  std::filesystem::create_directories(dir);
  auto w = WebFiles::load(dir.string());
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message.find("index.html"), std::string::npos) << w.error().message;
  std::filesystem::remove_all(dir);
}

TEST(Dashboard, OneSnapshotSharedWithinItsInterval) {
  Metrics m;
  m.expert_use.init(2, 3);
  DashboardInfo info;
  info.n_layer = 2, info.n_expert = 3;
  Dashboard d(info, m, "");
  const std::string a = d.snapshot();
  m.generated_tokens += 5;
  m.expert_use.count(1, 2);
  m.expert_use.count(1, 2);
  m.expert_use.count(5, 0);  // out of range: not counted, never written
  EXPECT_EQ(d.snapshot(), a) << "within the interval every caller gets the same snapshot";
  std::this_thread::sleep_for(Dashboard::kSnapshotMin + std::chrono::milliseconds(20));
  const auto j = nlohmann::json::parse(d.snapshot());
  EXPECT_EQ(j["serve"]["generated_tokens"], 5);
  EXPECT_EQ(j["routes"], nlohmann::json::parse("[[0,0,0],[0,0,2]]"));
  EXPECT_TRUE(j["daemon"].is_null()) << "no expertd (--local): no daemon figures";
  EXPECT_TRUE(j["experts"].is_null());
}

TEST(Dashboard, ViewersAreCapped) {
  Metrics m;
  Dashboard d({}, m, "");
  for (int i = 0; i < Dashboard::kViewersMax; ++i) EXPECT_TRUE(d.enter());
  EXPECT_FALSE(d.enter());
  d.leave();
  EXPECT_TRUE(d.enter());
}

TEST(Dashboard, AnExpertdThatIsNotThereIsNamed) {
  Metrics m;
  Dashboard d({}, m, "/nonexistent/expertd.sock");
  const auto j = nlohmann::json::parse(d.snapshot());
  EXPECT_TRUE(j["daemon"].is_null());
  ASSERT_TRUE(j.contains("daemon_error"));
  EXPECT_FALSE(j["daemon_error"].get<std::string>().empty());
}
