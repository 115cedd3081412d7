// expertd under bad input and failure: hostile frames, dying clients, I/O errors, bad packs.
#include <sys/socket.h>
#include <sys/un.h>

#include <nlohmann/json.hpp>
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
  bad = good->acquire(0, std::vector<uint32_t>{1, 2, 3});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("max_experts_per_request"), std::string::npos);
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
