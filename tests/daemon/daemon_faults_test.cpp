// expertd under bad input and failure: hostile frames, dying clients, I/O errors, bad packs.
#include <sys/socket.h>
#include <sys/un.h>

#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "daemon/fixture.h"
#include "proto/frame.h"

using namespace expertd;
using namespace expertd::test;

namespace {

int raw_connect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// Reads one frame; returns its error code, or nullopt when the daemon closed the connection.
std::optional<wire::ErrorCode> read_error(int fd) {
  std::vector<uint8_t> body;
  if (!proto::recv_frame(fd, body, 1 << 20)) return std::nullopt;
  auto env = proto::verify_envelope(body);
  if (!env || !(*env)->msg_as_Error()) return wire::ErrorCode::None;
  return (*env)->msg_as_Error()->code();
}

bool closed_by_peer(int fd) {
  char c;
  return ::recv(fd, &c, 1, 0) == 0;
}

// Copies the fixture's pack next to a private manifest, so a test may damage it.
std::string private_pack(const TempDir& d, const std::string& manifest_path) {
  auto m = pack::load_manifest(manifest_path);
  fs::copy_file(pack::manifest_dir(manifest_path) + "/" + m->pack_file, d / m->pack_file);
  fs::copy_file(manifest_path, d / "m.manifest.json");
  return d / "m.manifest.json";
}

}  // namespace

TEST_F(DaemonTest, MalformedFramesGetErrorsWhileOthersAreServed) {
  auto d = start({"--cache-slots", "16", "--clients-max", "8", "--max-experts-per-request", "2"});
  auto good = connect();
  ASSERT_TRUE(good);
  use(*good, 0, {1, 2});
  {  // oversized length
    int fd = raw_connect(socket());
    uint8_t h[4] = {0xFF, 0xFF, 0xFF, 0xFF};
    ASSERT_EQ(::send(fd, h, 4, 0), 4);
    EXPECT_EQ(read_error(fd), wire::ErrorCode::BadFrame);
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  {  // a frame that is not a flatbuffer
    int fd = raw_connect(socket());
    uint8_t f[4 + 16] = {16, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    ASSERT_EQ(::send(fd, f, sizeof f, 0), static_cast<ssize_t>(sizeof f));
    EXPECT_EQ(read_error(fd), wire::ErrorCode::BadFrame);
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  {  // a truncated frame, then the client vanishes
    int fd = raw_connect(socket());
    uint8_t f[6] = {100, 0, 0, 0, 1, 2};
    ASSERT_EQ(::send(fd, f, sizeof f, 0), 6);
    ::close(fd);
  }
  {  // a valid Acquire before Hello
    int fd = raw_connect(socket());
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<uint32_t> ids{1};
    auto frame = proto::make_frame(fbb, 7, wire::CreateAcquireDirect(fbb, 0, &ids));
    ASSERT_TRUE(proto::send_all(fd, frame));
    EXPECT_EQ(read_error(fd), wire::ErrorCode::BadRequest);
    ::close(fd);
  }
  // Ids out of range and duplicates: an error, and the connection stays usable.
  auto bad = good->acquire(5, std::vector<uint32_t>{1});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("OutOfRange: layer 5 out of range"), std::string::npos)
      << bad.error().message;
  bad = good->acquire(0, std::vector<uint32_t>{kExperts});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("OutOfRange: expert 32"), std::string::npos)
      << bad.error().message;
  bad = good->acquire(0, std::vector<uint32_t>{3, 3});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("duplicate"), std::string::npos);
  std::vector<uint32_t> too_many(kExperts + 1);
  for (uint32_t i = 0; i < too_many.size(); ++i) too_many[i] = i;
  bad = good->acquire(0, too_many);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("33 experts exceed the layer's 32 experts"), std::string::npos)
      << bad.error().message;
  use(*good, 1, {4, 5});
  EXPECT_GE(stat(*good, "client_errors"), 7);
  EXPECT_TRUE(d->alive());
}

TEST_F(DaemonTest, TooManyClientsAreRefusedClearly) {
  auto d = start({"--cache-slots", "4", "--clients-max", "1", "--max-experts-per-request", "4"});
  auto a = connect();
  ASSERT_TRUE(a);
  auto b = client::Client::connect(socket(), {"second", 5000});
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("TooManyClients"), std::string::npos) << b.error().message;
  use(*a, 0, {1});
}

TEST_F(DaemonTest, KilledClientReleasesItsLeases) {
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4"});
  pid_t pid = ::fork();
  if (pid == 0) {
    auto c = client::Client::connect(socket());
    if (!c) ::_exit(3);
    auto l = (*c)->acquire(0, std::vector<uint32_t>{0, 1, 2, 3});
    if (!l || !(*c)->wait_ready(*l)) ::_exit(4);
    ::kill(::getpid(), SIGKILL);  // dies holding the lease
  }
  int st;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << "child exited " << WEXITSTATUS(st);
  auto c = connect();
  for (int i = 0; i < 200 && stat(*c, "leases") > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(stat(*c, "leases"), 0);
  EXPECT_EQ(stat(*c, "slots_pinned"), 0);
  // All 8 slots are usable again: two working sets of 4 that need every slot.
  auto c2 = connect();
  auto l1 = c->acquire(1, std::vector<uint32_t>{0, 1, 2, 3});
  auto l2 = c2->acquire(1, std::vector<uint32_t>{4, 5, 6, 7});
  ASSERT_TRUE(l1 && l2);
  EXPECT_TRUE(c->wait_ready(*l1));
  EXPECT_TRUE(c2->wait_ready(*l2));
  EXPECT_EQ(stat(*c, "slots_pinned"), 8);
}

TEST_F(DaemonTest, IoErrorReachesTheRequesterAndTheCounters) {
  TempDir d;
  std::string mf = private_pack(d, manifest_path());
  auto daemon =
      start({"--cache-slots", "8", "--clients-max", "1", "--max-experts-per-request", "4"}, mf);
  auto c = connect();
  use(*c, 0, {0});
  // The pack is truncated under the running daemon: later reads hit the end of the file.
  fs::resize_file(d / manifest_->pack_file, manifest_->offset(0, 1));
  auto l = c->acquire(0, std::vector<uint32_t>{0, 5});
  ASSERT_TRUE(l);
  EXPECT_EQ(l->ready[0], 1);  // still cached
  auto st = c->wait_ready(*l);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("IoError"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("expert 5"), std::string::npos) << st.error().message;
  ASSERT_TRUE(c->release(*l));
  EXPECT_EQ(stat(*c, "io_errors"), 1);
  EXPECT_EQ(stat(*c, "fallback_count"), 0);
  use(*c, 0, {0});  // the daemon keeps serving what it can
  EXPECT_TRUE(daemon->alive());
}

TEST_F(DaemonTest, CorruptBytesAreAChecksumErrorNeverServed) {
  TempDir d;
  std::string mf = private_pack(d, manifest_path());
  auto daemon =
      start({"--cache-slots", "8", "--clients-max", "1", "--max-experts-per-request", "4"}, mf);
  {
    std::fstream f(d / manifest_->pack_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(manifest_->offset(1, 7) + 1000));
    f.put('\x5a');
  }
  auto c = connect();
  auto l = c->acquire(1, std::vector<uint32_t>{6, 7});
  ASSERT_TRUE(l);
  auto st = c->wait_ready(*l);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("ChecksumError"), std::string::npos) << st.error().message;
  EXPECT_TRUE(c->wait_ready(*l, 0));  // the intact expert is served
  ASSERT_TRUE(c->release(*l));
  EXPECT_EQ(stat(*c, "checksum_errors"), 1);
  EXPECT_EQ(stat(*c, "io_errors"), 1);
}

TEST_F(DaemonTest, StartupRefusesBadPacksAndTooSmallCaches) {
  auto refuse = [&](const std::string& manifest, std::vector<std::string> flags,
                    const std::string& needle) {
    Daemon d(manifest, socket(), flags);
    std::string log;
    ASSERT_FALSE(d.start(&log)) << "started; expected: " << needle;
    EXPECT_NE(d.exit_status(), 0);
    EXPECT_NE(log.find(needle), std::string::npos) << log;
  };
  std::vector<std::string> ok_flags = {
      "--cache-slots", "8", "--clients-max", "1", "--max-experts-per-request", "4"};
  // Breaks the O_DIRECT contract: a data_start that is not 4096-aligned.
  {
    TempDir d;
    std::string mf = private_pack(d, manifest_path());
    auto j = nlohmann::json::parse(read_file(mf));
    j["data_start"] = 2048;
    write_file(mf, j.dump());
    refuse(mf, ok_flags, "breaks the 4096-byte layout");
  }
  {  // a stride that is not a multiple of 4096
    TempDir d;
    std::string mf = private_pack(d, manifest_path());
    auto j = nlohmann::json::parse(read_file(mf));
    j["layers"][1]["stride"] = j["layers"][1]["stride"].get<uint64_t>() + 512;
    write_file(mf, j.dump());
    refuse(mf, ok_flags, "not a multiple of 4096");
  }
  {  // manifest and header disagree
    TempDir d;
    std::string mf = private_pack(d, manifest_path());
    auto j = nlohmann::json::parse(read_file(mf));
    j["model_id"] = "0123456789abcdef";
    write_file(mf, j.dump());
    refuse(mf, ok_flags, "pack header and manifest disagree (model_id)");
  }
  {  // a pack shorter than its manifest says
    TempDir d;
    std::string mf = private_pack(d, manifest_path());
    fs::resize_file(d / manifest_->pack_file, manifest_->pack_bytes - 4096);
    refuse(mf, ok_flags, "differs from the manifest");
  }
  refuse(manifest_path(),
         {"--cache-slots", "6", "--clients-max", "2", "--max-experts-per-request", "4"},
         "cannot hold 2 clients x 4 experts per request = 8 slots");
  refuse(manifest_path(), {"--policy", "random"}, "--policy must be one of");
  refuse(local_ / "missing.manifest.json", ok_flags, "missing.manifest.json");
}

// The shipped example config is valid: every key is a real option (it stops at its manifest).
TEST(ExampleConfig, EveryKeyIsAnOption) {
  auto [rc, out] = run(bin("daemon/expertd") + " --config " + std::string(EXPERTD_SOURCE_DIR) +
                       "/systemd/expertd.conf.example --socket /tmp/expertd-example-test.sock");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("/var/lib/expertd/Qwen3-30B-A3B-Q4_K_M.manifest.json"), std::string::npos)
      << out;
}

// SIGHUP reopens the log and the trace (logrotate moves them away first).
TEST_F(DaemonTest, SighupReopensLogAndTrace) {
  std::string logf = local_ / "expertd.log", trace = local_ / "t.bin";
  auto d = start({"--cache-slots", "4", "--clients-max", "1", "--max-experts-per-request", "2",
                  "--log-path", logf, "--trace-path", trace});
  auto c = connect();
  use(*c, 0, {1});
  fs::rename(logf, logf + ".1");
  ASSERT_TRUE(c->stats());  // the trace record of the first acquire is buffered until flushed
  fs::rename(trace, trace + ".1");
  ::kill(d->pid(), SIGHUP);
  for (int i = 0; i < 200 && !(fs::exists(logf) && fs::exists(trace)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(fs::exists(logf));
  ASSERT_TRUE(fs::exists(trace));
  use(*c, 1, {2});
  c.reset();
  EXPECT_EQ(d->stop(), 0);
  EXPECT_NE(read_file(logf).find("stopped"), std::string::npos) << read_file(logf);
  EXPECT_EQ(read_file(trace).size(), 16u + 16 + 2);         // header + the second acquire
  EXPECT_EQ(read_file(trace + ".1").size(), 16u + 16 + 2);  // header + the first acquire
  EXPECT_NE(read_file(logf + ".1").find("serving"), std::string::npos);
}

// Where no GPU is usable (CI, a container without one), asking for the cuda arena is a clear
// start-up error naming the cause, never a silent fall back to host memory. (On a machine with a
// GPU the cuda arena starts: that path is the gpu-labelled tests'.)
TEST_F(DaemonTest, CudaBackendWithoutAUsableGpuIsAClearStartupError) {
  Daemon d(manifest_path(), socket(),
           {"--backend", "cuda", "--cache-slots", "16", "--clients-max", "1"});
  std::string log;
  if (d.start(&log)) GTEST_SKIP() << "a GPU is usable here: the cuda arena started";
  EXPECT_NE(d.exit_status(), 0);
  const bool no_device = log.find("no usable CUDA device") != std::string::npos;
  const bool no_tier = log.find("this build has no CUDA arena") != std::string::npos;
  EXPECT_TRUE(no_device || no_tier) << log;
  EXPECT_EQ(log.find("serving"), std::string::npos) << "it must not serve from host memory instead";
}

// Monitoring answers while engines fill --clients-max, and a monitor pins nothing.
TEST_F(DaemonTest, MonitorsTakeNoEnginePlaceAndCannotAcquire) {
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4"});
  auto a = connect(), b = connect();
  ASSERT_TRUE(a && b);
  auto third = client::Client::connect(socket(), {"third", 5000});
  ASSERT_FALSE(third);
  EXPECT_NE(third.error().message.find("TooManyClients"), std::string::npos);
  auto [rc, out] = run(bin("client/expertctl") + " --socket " + socket() + " stats");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("hits"), std::string::npos) << out;
  auto mon = client::Client::connect(socket(), {"monitor", 5000, /*monitor=*/true});
  ASSERT_TRUE(mon) << mon.error().message;
  EXPECT_EQ(mon->get()->arena(), nullptr);  // maps no arena
  uint32_t id = 1;
  auto l = (*mon)->acquire(0, std::span(&id, 1));
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().message.find("monitor"), std::string::npos) << l.error().message;
  EXPECT_EQ(stat(**mon, "clients"), 2);
  EXPECT_EQ(stat(**mon, "monitors"), 1);
  EXPECT_GE(stat(**mon, "clients_refused"), 1);
  use(*a, 0, {1});
  use(*b, 1, {2});
}

// A connection that never says Hello is closed and counted; connections that say nothing cannot
// lock engines out (they wait in --pending-max, not in --clients-max), and over --pending-max a
// new connection gets a clear refusal.
TEST_F(DaemonTest, SilentConnectionsAreClosedAfterTheHelloTimeout) {
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4",
                  "--hello-timeout-ms", "300", "--pending-max", "6"});
  std::vector<int> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(raw_connect(socket()));
  auto a = connect(), b = connect();  // both engine places are still free
  ASSERT_TRUE(a && b);
  for (int i = 0; i < 2; ++i) silent.push_back(raw_connect(socket()));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  int over = raw_connect(socket());  // a seventh silent one is over --pending-max
  EXPECT_EQ(read_error(over), wire::ErrorCode::TooManyClients);
  ::close(over);
  const auto t0 = std::chrono::steady_clock::now();
  for (int fd : silent) {
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
  EXPECT_EQ(stat(*a, "hello_timeouts"), 6);
  EXPECT_EQ(stat(*a, "pending"), 0);
  EXPECT_GE(stat(*a, "clients_refused"), 1);
  use(*a, 0, {3});
  use(*b, 1, {4});
  EXPECT_TRUE(d->alive());
}

// The Hello reply goes through the write queue: a client that says Hello and never reads does
// not stall the control thread for the others. The model has so many layers that its Hello
// reply (~0.4 MB) exceeds a socket's send buffer (212 KB by default): a blocking send would wait
// for the reader forever.
TEST_F(DaemonTest, AHelloNobodyReadsDoesNotStallOthers) {
  TempDir big;
  engine::SynthOptions o;
  o.dims = {64, 1500, 2, 1, 32, 2, 1, 300};
  o.type = gguf::GgmlType::Q8_0;
  o.out_path = big / "deep.gguf";
  o.progress = false;
  ASSERT_TRUE(engine::write_synth(o));
  pack::BuildOptions bo;
  bo.model_path = o.out_path;
  bo.progress = false;
  auto rep = pack::build_pack(bo);
  ASSERT_TRUE(rep) << rep.error().message;
  auto d = start({"--cache-slots", "64", "--clients-max", "4", "--max-experts-per-request", "4"},
                 rep->manifest_path);
  int fd = raw_connect(socket());
  flatbuffers::FlatBufferBuilder fbb(256);
  ASSERT_TRUE(proto::send_all(
      fd,
      proto::make_frame(fbb, 1, wire::CreateHelloDirect(fbb, proto::kProtocolVersion, "mute"))));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  auto b = client::Client::connect(socket(), {"other", 5000});
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  uint32_t id = 1;
  auto l = (*b)->acquire(7, std::span(&id, 1));
  ASSERT_TRUE(l) << l.error().message;
  ASSERT_TRUE((*b)->wait_ready(*l));
  ASSERT_TRUE((*b)->release(*l));
  ::close(fd);
  EXPECT_TRUE(d->alive());
}

// --allow-uid / --allow-gid: a second fence after the socket's mode, checked with SO_PEERCRED.
TEST_F(DaemonTest, OnlyAllowedPeersAreServed) {
  const std::string me = std::to_string(::getuid());
  {
    auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4",
                    "--allow-uid", "4242424", "--allow-gid", "4242424"});
    auto c = client::Client::connect(socket(), {"stranger", 5000});
    ASSERT_FALSE(c);
    EXPECT_NE(c.error().message.find("is not allowed"), std::string::npos) << c.error().message;
    EXPECT_TRUE(d->alive());
  }
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4",
                  "--allow-uid", "4242424," + me});
  auto c = connect();
  ASSERT_TRUE(c);
  use(*c, 0, {1});
}

// Seeded mutations of every request the daemon takes (the request handling behind the frame
// fuzz target, on a real daemon and socket), each on a connection that said Hello: the daemon
// answers or closes, never crashes or hangs, and a good client is served throughout.
TEST_F(DaemonTest, SeededRequestMutationsAreAnsweredOrClosedWhileOthersAreServed) {
  auto d = start({"--cache-slots", "16", "--clients-max", "4", "--max-experts-per-request", "4",
                  "--acquire-wait-ms-max", "300"});
  auto good = connect();
  ASSERT_TRUE(good);
  std::vector<std::vector<uint8_t>> seeds;
  {
    std::vector<uint32_t> ids = {1, 2};
    flatbuffers::FlatBufferBuilder a(256), r(64), p(256), w(256), s(64), t(64), e(256);
    seeds.push_back(proto::make_frame(a, 2, wire::CreateAcquireDirect(a, 0, &ids)));
    seeds.push_back(proto::make_frame(r, 3, wire::CreateRelease(r, 1)));
    seeds.push_back(proto::make_frame(p, 4, wire::CreatePrefetchDirect(p, 1, &ids)));
    seeds.push_back(
        proto::make_frame(w, 5, wire::CreateAdminDirect(w, wire::AdminOp::Warmup, 1, &ids)));
    seeds.push_back(proto::make_frame(s, 6, wire::CreateStatsRequest(s)));
    seeds.push_back(proto::make_frame(t, 7, wire::CreateStatusRequest(t)));
    seeds.push_back(
        proto::make_frame(e, 8, wire::CreateHelloDirect(e, proto::kProtocolVersion, "again")));
  }
  std::mt19937_64 rng(20261204);
  for (int i = 0; i < 120; ++i) {
    int fd = raw_connect(socket());
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    flatbuffers::FlatBufferBuilder h(256);
    ASSERT_TRUE(proto::send_all(
        fd, proto::make_frame(h, 1, wire::CreateHelloDirect(h, proto::kProtocolVersion, "m"))));
    std::vector<uint8_t> body;
    std::vector<int> fds;
    ASSERT_TRUE(proto::recv_frame(fd, body, 64u << 20, &fds));
    for (int f : fds) ::close(f);
    // Mutate the body, keep the length prefix true to it (a lying prefix only makes the daemon
    // wait for bytes that never come, which the frame fuzz target covers).
    const auto& seed = seeds[i % seeds.size()];
    std::vector<uint8_t> m(seed.begin() + 4, seed.end());
    switch (rng() % 3) {
      case 0:
        for (int k = 0; k < 1 + int(rng() % 6); ++k)
          m[rng() % m.size()] ^= uint8_t(1u << (rng() % 8));
        break;
      case 1:
        m.resize(1 + rng() % m.size());
        break;
      default: {
        uint32_t v = rng() % 2 ? ~0u : uint32_t(rng());
        size_t at = rng() % m.size();
        std::memcpy(m.data() + at, &v, std::min<size_t>(4, m.size() - at));
      }
    }
    const uint32_t n = static_cast<uint32_t>(m.size());
    m.insert(m.begin(), {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)});
    (void)proto::send_all(fd, m);
    flatbuffers::FlatBufferBuilder q(64);
    const bool sent = static_cast<bool>(
        proto::send_all(fd, proto::make_frame(q, 99, wire::CreateStatsRequest(q))));
    // Frames until the stats reply (the daemon still serves this connection) or the close.
    for (int k = 0; sent && k < 64; ++k) {
      errno = 0;
      if (!proto::recv_frame(fd, body, 64u << 20)) {
        EXPECT_NE(errno, EAGAIN) << "mutation " << i << ": no answer and no close within 5 s";
        break;
      }
      auto env = proto::verify_envelope(body);
      if (env && (*env)->request_id() == 99) break;
    }
    ::close(fd);
    ASSERT_TRUE(d->alive()) << "mutation " << i;
  }
  use(*good, 0, {3, 4});
  use(*good, 1, {1});
  EXPECT_GT(stat(*good, "client_errors"), 0);
}
