// The per-expert snapshot (ExpertsRequest, Client::experts_json) and its views (expertctl stats
// --experts, expertctl top) against a real expertd on a real socket and pack.
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <thread>

#include "daemon/fixture.h"
#include "proto/frame.h"

using namespace expertd;
using namespace expertd::test;
using json = nlohmann::json;

namespace {

json snapshot(client::Client& c) {
  auto s = c.experts_json();
  EXPECT_TRUE(s) << (s ? "" : s.error().message);
  return s ? json::parse(*s) : json();
}

uint64_t at(const json& j, uint32_t layer, const char* key, uint32_t e) {
  return j["layers"][layer][key][e].get<uint64_t>();
}

char resident(const json& j, uint32_t layer, uint32_t e) {
  return j["layers"][layer]["resident"].get<std::string>()[e];
}

// Polls until the what-if replay covers `accesses` accesses (it runs on the daemon's worker).
json snapshot_with_what_if(client::Client& c, uint64_t accesses) {
  json j;
  for (int i = 0; i < 100; ++i) {
    j = snapshot(c);
    if (j["what_if_accesses"].get<uint64_t>() >= accesses && !j["what_if"].empty()) return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "the what-if replay never covered " << accesses << " accesses: " << j.dump();
  return j;
}

// The heat map's rows in a frame of expertctl top: "  <layer> |<one char per cell>| ...".
std::vector<std::string> grid_rows(const std::string& frame) {
  static const std::regex row(R"((?:^|\n)\s*\d+ \|([^|]*)\|)");
  std::vector<std::string> out;
  for (std::sregex_iterator it(frame.begin(), frame.end(), row), end; it != end; ++it)
    out.push_back((*it)[1].str());
  return out;
}

}  // namespace

TEST_F(DaemonTest, ExpertsSnapshotCountsHitsAndMissesPerExpert) {
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4",
                  "--policy", "lru"});
  auto c = connect();
  ASSERT_TRUE(c);
  json j = snapshot(*c);
  EXPECT_EQ(j["n_layer"], kLayers);
  EXPECT_EQ(j["n_expert"], kExperts);
  EXPECT_EQ(j["tiers"], "host");
  ASSERT_EQ(j["layers"].size(), kLayers);
  for (const auto& l : j["layers"]) {
    EXPECT_EQ(l["resident"].get<std::string>(), std::string(kExperts, '.'));
    EXPECT_EQ(l["hits"].size(), kExperts);
    EXPECT_EQ(l["misses"].size(), kExperts);
  }
  // Layer 0: 3 missed then hit twice, 5 missed once; layer 1: 7 missed then hit once.
  use(*c, 0, {3, 5});
  use(*c, 0, {3});
  use(*c, 0, {3});
  use(*c, 1, {7});
  use(*c, 1, {7});
  j = snapshot(*c);
  EXPECT_EQ(at(j, 0, "misses", 3), 1u);
  EXPECT_EQ(at(j, 0, "hits", 3), 2u);
  EXPECT_EQ(at(j, 0, "misses", 5), 1u);
  EXPECT_EQ(at(j, 0, "hits", 5), 0u);
  EXPECT_EQ(at(j, 1, "misses", 7), 1u);
  EXPECT_EQ(at(j, 1, "hits", 7), 1u);
  uint64_t all = 0;
  for (const auto& l : j["layers"])
    for (const char* k : {"hits", "misses"})
      for (const auto& v : l[k]) all += v.get<uint64_t>();
  EXPECT_EQ(all, 6u);  // nothing else moved
  EXPECT_EQ(at(j, 0, "hits", 3) + at(j, 1, "hits", 7), stat(*c, "cache_hits"));
  // Residency: what was read is in a host slot, nothing else.
  EXPECT_EQ(resident(j, 0, 3), 'H');
  EXPECT_EQ(resident(j, 0, 5), 'H');
  EXPECT_EQ(resident(j, 1, 7), 'H');
  EXPECT_EQ(resident(j, 1, 3), '.');
  std::string l0 = j["layers"][0]["resident"];
  EXPECT_EQ(std::count(l0.begin(), l0.end(), 'H'), 2);
  EXPECT_EQ(j["drive"]["read_bytes"].get<uint64_t>(), 3 * stride());
  EXPECT_GT(j["t_us"].get<uint64_t>(), 0u);
  // The connection itself is listed, with its acquires.
  bool found = false;
  for (const auto& e : j["engines"])
    if (e["name"] == "test" && e["kind"] == "engine") {
      found = true;
      EXPECT_EQ(e["pid"], ::getpid());
      EXPECT_EQ(e["acquires"], 5);
      EXPECT_GE(e["connected_s"].get<double>(), 0.0);
    }
  EXPECT_TRUE(found) << j["engines"].dump();

  // evict-all: nothing resident; the counters stay. reset-stats: the counters go.
  ASSERT_TRUE(c->admin(client::AdminOp::EvictAll));
  j = snapshot(*c);
  for (const auto& l : j["layers"])
    EXPECT_EQ(l["resident"].get<std::string>(), std::string(kExperts, '.'));
  EXPECT_EQ(at(j, 0, "hits", 3), 2u);
  ASSERT_TRUE(c->admin(client::AdminOp::ResetStats));
  j = snapshot(*c);
  EXPECT_EQ(at(j, 0, "hits", 3), 0u);
  EXPECT_EQ(at(j, 1, "misses", 7), 0u);
  use(*c, 1, {7});  // read again after the eviction: a miss
  j = snapshot(*c);
  EXPECT_EQ(at(j, 1, "misses", 7), 1u);
  EXPECT_EQ(resident(j, 1, 7), 'H');
}

TEST_F(DaemonTest, ExpertsSnapshotCountsBoardAcquiresToo) {
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4"});
  auto c = connect();
  ASSERT_TRUE(c);
  use(*c, 0, {1, 2});  // read: misses through the socket
  for (int i = 0; i < 3; ++i) {
    auto l = c->acquire(0, std::vector<uint32_t>{1, 2});
    ASSERT_TRUE(l);
    EXPECT_TRUE(l->from_board);  // resident: pinned from the board, no round trip
    ASSERT_TRUE(c->release(*l));
  }
  json j = snapshot(*c);  // the daemon drains the board before it answers
  EXPECT_EQ(at(j, 0, "misses", 1), 1u);
  EXPECT_EQ(at(j, 0, "hits", 1), 3u);
  EXPECT_EQ(at(j, 0, "hits", 2), 3u);
  for (const auto& e : j["engines"])
    if (e["name"] == "test") {
      EXPECT_EQ(e["acquires"], 4);
    }
}

TEST_F(DaemonTest, WhatIfIsMonotoneInCacheSize) {
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4"});
  auto c = connect();
  ASSERT_TRUE(c);
  // A skewed routing, as real ones are: a few experts of each layer take most of the picks.
  std::mt19937 rng(7);
  std::vector<double> weight(kExperts);
  for (uint32_t e = 0; e < kExperts; ++e) weight[e] = 1.0 / (1.0 + e);
  std::discrete_distribution<uint32_t> pick(weight.begin(), weight.end());
  uint64_t accesses = 0;
  for (int step = 0; step < 150; ++step)
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      std::vector<uint32_t> ids;
      while (ids.size() < 2)
        if (uint32_t e = pick(rng); std::find(ids.begin(), ids.end(), e) == ids.end())
          ids.push_back(e);
      use(*c, layer, ids);
      accesses += ids.size();
    }
  json j = snapshot_with_what_if(*c, accesses);
  const auto& w = j["what_if"];
  ASSERT_EQ(w.size(), 4u) << w.dump();  // 4, 8, 16, 32 slots
  EXPECT_EQ(w[0]["slots"], 4);
  EXPECT_EQ(w[1]["slots"], 8);
  EXPECT_EQ(w[3]["slots"], 32);
  EXPECT_EQ(w[1]["cache_mib"].get<uint64_t>(), (8 * stride() + (1u << 19)) >> 20);
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_FALSE(w[i]["hit_rate"].is_null()) << w.dump();
    if (i > 0) {
      EXPECT_GE(w[i]["hit_rate"].get<double>(), w[i - 1]["hit_rate"].get<double>());
    }
  }
  EXPECT_GT(w[3]["hit_rate"].get<double>(), w[0]["hit_rate"].get<double>());
  // The 1x row replays the daemon's own policy and slots over the whole run: its hit rate.
  EXPECT_NEAR(w[1]["hit_rate"].get<double>(), stat(*c, "hit_rate"), 1e-9);
  EXPECT_EQ(j["what_if_accesses"].get<uint64_t>(), accesses);
  EXPECT_GT(j["what_if_replay_s"].get<double>(), 0.0);
  EXPECT_LT(j["what_if_age_s"].get<double>(), 5.0);
}

TEST_F(DaemonTest, ExpertctlStatsExpertsAndTop) {
  // clients-max 4: each expertctl may connect before the daemon has seen the previous one close.
  auto d = start({"--cache-slots", "8", "--clients-max", "4", "--max-experts-per-request", "2"});
  auto c = connect();
  ASSERT_TRUE(c);
  use(*c, 0, {1, 2});
  use(*c, 1, {3});
  use(*c, 1, {3});
  const std::string ctl = bin("client/expertctl") + " --socket " + socket();
  auto [rc, out] = run(ctl + " stats --experts --json");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "one line";
  json j = json::parse(out);
  for (const char* k :
       {"t_us", "n_layer", "n_expert", "tiers", "layers", "engines", "drive", "what_if"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(at(j, 1, "hits", 3), 1u);
  EXPECT_TRUE(j["drive"].contains("read_mib_s_measured"));
  std::tie(rc, out) = run(ctl + " stats --experts");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("hit rate"), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\n\s+1\s+\d+\s+1/32\s+1\s+1\s+50\.0%)"))) << out;
  // top, not on a terminal: one frame, one grid row per layer, then out.
  std::tie(rc, out) = run(ctl + " top --watch 0.2 < /dev/null");
  EXPECT_EQ(rc, 0) << out;
  std::string grid;
  for (const auto& row : grid_rows(out)) grid += row + "\n";
  EXPECT_EQ(grid_rows(out).size(), kLayers) << out;
  EXPECT_EQ(grid.size(), kLayers * (kExperts + 1)) << out;  // one char per expert
  EXPECT_EQ(std::count(grid.begin(), grid.end(), 'H'), 3) << out;
  EXPECT_EQ(out.find('\033'), std::string::npos) << "no escapes in a pipe";
  for (const char* k : {"hit rate", "acquires", "drive", "latency", "engines", "what if"})
    EXPECT_NE(out.find(k), std::string::npos) << k << "\n" << out;
  // Narrow: 32 experts fold into fewer characters per row, still one row per layer.
  std::tie(rc, out) = run("COLUMNS=40 " + ctl + " top < /dev/null");
  EXPECT_EQ(rc, 0) << out;
  for (const auto& row : grid_rows(out)) EXPECT_LT(row.size(), kExperts) << out;
  EXPECT_EQ(grid_rows(out).size(), kLayers) << out;
  std::tie(rc, out) = run(ctl + " --help");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("top "), std::string::npos) << out;
  EXPECT_NE(out.find("--experts"), std::string::npos) << out;
}

// On a terminal (a pty), top redraws in place every --watch seconds, and q or Ctrl-C ends it with
// the terminal as it was: the main screen back, the cursor shown, canonical mode and echo on.
TEST_F(DaemonTest, ExpertctlTopOnATerminalRefreshesAndQuitsCleanly) {
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4"});
  auto c = connect();
  ASSERT_TRUE(c);
  use(*c, 0, {1, 2});
  for (const char* way : {"q", "SIGINT"}) {
    const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    ASSERT_GE(master, 0);
    ASSERT_EQ(::grantpt(master), 0);
    ASSERT_EQ(::unlockpt(master), 0);
    const std::string slave_path = ::ptsname(master);
    const int slave = ::open(slave_path.c_str(), O_RDWR | O_NOCTTY | O_CLOEXEC);
    ASSERT_GE(slave, 0);
    winsize ws{};
    ws.ws_col = 100;
    ws.ws_row = 30;
    ::ioctl(slave, TIOCSWINSZ, &ws);
    const std::string exe = bin("client/expertctl"), sock = socket();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setsid();
      const int tty = ::open(slave_path.c_str(), O_RDWR);  // the controlling terminal
      ::dup2(tty, 0), ::dup2(tty, 1), ::dup2(tty, 2);
      ::execl(exe.c_str(), exe.c_str(), "--socket", sock.c_str(), "top", "--watch", "0.2",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    std::string seen;
    auto read_until = [&](const std::string& what, int frames) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      auto count = [&] {
        size_t n = 0;
        for (size_t at = seen.find(what); at != std::string::npos; at = seen.find(what, at + 1))
          ++n;
        return n;
      };
      while (count() < size_t(frames) && std::chrono::steady_clock::now() < until) {
        pollfd p{master, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        char buf[4096];
        const ssize_t n = ::read(master, buf, sizeof buf);
        if (n <= 0) break;
        seen.append(buf, static_cast<size_t>(n));
      }
      return count() >= size_t(frames);
    };
    EXPECT_TRUE(read_until("expertd top", 3)) << way << ": three frames\n" << seen;
    EXPECT_NE(seen.find("\033[?1049h"), std::string::npos) << "the alternate screen";
    EXPECT_NE(seen.find("\033[H"), std::string::npos) << "redrawn in place";
    if (std::string(way) == "q")
      ASSERT_EQ(::write(master, "q", 1), 1);
    else
      ::kill(pid, SIGINT);
    EXPECT_TRUE(read_until("\033[?1049l", 1)) << way << ": the main screen back\n" << seen;
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << way << " " << st;
    EXPECT_NE(seen.find("\033[?25h"), std::string::npos) << "the cursor shown again";
    termios t{};
    ASSERT_EQ(::tcgetattr(slave, &t), 0);
    EXPECT_TRUE((t.c_lflag & ICANON) && (t.c_lflag & ECHO)) << way << ": the terminal restored";
    ::close(slave);
    ::close(master);
  }
}

TEST_F(DaemonTest, AnUnsupportedRequestGetsAClearErrorAndServingGoesOn) {
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4"});
  auto c = connect();
  ASSERT_TRUE(c);
  use(*c, 0, {1});
  // A union member this daemon does not know (a newer client's request): BadRequest by name.
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", socket().c_str());
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  auto reply = [&](std::vector<uint8_t> frame) {
    EXPECT_TRUE(proto::send_all(fd, frame));
    std::vector<uint8_t> body;
    EXPECT_TRUE(proto::recv_frame(fd, body, 64u << 20));
    return body;
  };
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = reply(proto::make_frame(
        fbb, 1,
        wire::CreateHelloDirect(fbb, proto::kProtocolVersion, "raw", wire::ClientKind::Monitor)));
    ASSERT_TRUE(wire::GetEnvelope(body.data())->msg_as_HelloReply());
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto env =
        wire::CreateEnvelope(fbb, 2, static_cast<wire::Message>(200), wire::CreateAck(fbb).Union());
    fbb.Finish(env);
    auto body = reply(proto::to_frame(fbb));
    const auto* er = wire::GetEnvelope(body.data())->msg_as_Error();
    ASSERT_TRUE(er);
    EXPECT_EQ(er->code(), wire::ErrorCode::BadRequest);
    EXPECT_NE(er->message()->str().find("not accepted"), std::string::npos);
  }
  {  // the same connection still gets its snapshot
    flatbuffers::FlatBufferBuilder fbb;
    auto body = reply(proto::make_frame(fbb, 3, wire::CreateExpertsRequest(fbb)));
    auto env = proto::verify_envelope(body);
    ASSERT_TRUE(env);
    const auto* r = (*env)->msg_as_ExpertsReply();
    ASSERT_TRUE(r);
    EXPECT_EQ((*env)->request_id(), 3u);
    EXPECT_EQ(r->residency()->size(), size_t{kLayers} * kExperts);
  }
  ::close(fd);
  // Before Hello, a snapshot is refused like anything else.
  fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = reply(proto::make_frame(fbb, 4, wire::CreateExpertsRequest(fbb)));
    const auto* er = wire::GetEnvelope(body.data())->msg_as_Error();
    ASSERT_TRUE(er);
    EXPECT_EQ(er->code(), wire::ErrorCode::BadRequest);
  }
  ::close(fd);
  use(*c, 0, {1});
  json j = snapshot(*c);
  EXPECT_EQ(at(j, 0, "hits", 1), 1u);
  EXPECT_TRUE(d->alive());
}
