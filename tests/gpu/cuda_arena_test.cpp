// expertd --backend cuda with real engine processes: the slot arena shared over a CUDA IPC
// memory handle by two processes at once, and slots published only through their interprocess
// events while a flood of misses recycles slots and a two-buffer staging ring.
// Also built against the CPU emulation of the CUDA runtime (tests/cuda_emu): there the daemon is
// expertd_emu and the engine gpu_probe_emu, the arena shared memory opened through emulated IPC;
// copies complete at once there, so only a GPU tests the events' ordering.
#include "client/expert_client.h"
#include "daemon/fixture.h"
#include "gpu_util.h"

namespace expertd::test {
namespace {

class GpuArenaTest : public DaemonTest {
 protected:
  void SetUp() override { EXPERTD_REQUIRE_GPU(); }
  std::string probe(uint32_t layer, uint32_t rounds, uint32_t chunk) const {
#ifdef EXPERTD_CUDA_EMULATION
    const std::string exe = bin("tests/gpu_probe_emu");
#else
    const std::string exe = bin("tests/gpu_probe");
#endif
    return exe + " " + socket() + " " + manifest_path() + " " + std::to_string(layer) + " " +
           std::to_string(rounds) + " " + std::to_string(chunk);
  }
};

TEST_F(GpuArenaTest, TwoEngineProcessesReadTheSameIpcArena) {
  auto d = start({"--backend", "cuda", "--cache-slots", "64", "--clients-max", "3", "--stage-slots", "4"});
  ASSERT_TRUE(d->alive());
  // Two engine processes at once, one per layer, each checking every byte it reads from VRAM.
  auto [rc, out] = run("(" + probe(0, 2, 4) + " > " + local_ / "a.out" + " 2>&1 & " + probe(1, 2, 4) + " > " +
                       local_ / "b.out" + " 2>&1 & wait %1 && wait %2)");
  const std::string a = read_file(local_ / "a.out"), b = read_file(local_ / "b.out");
  EXPECT_EQ(rc, 0) << a << b << d->log();
  EXPECT_EQ(a, "ok " + std::to_string(2 * kExperts) + "\n") << a;
  EXPECT_EQ(b, "ok " + std::to_string(2 * kExperts) + "\n") << b;
  auto c = connect();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->info().arena_kind, "cuda");
  EXPECT_EQ(stat(*c, "h2d_bytes"), stat(*c, "pack_read_bytes"));
  EXPECT_GT(stat(*c, "h2d_bytes"), 0);
  EXPECT_EQ(stat(*c, "copy_errors"), 0);
  EXPECT_EQ(stat(*c, "io_errors"), 0);
}

TEST_F(GpuArenaTest, EventsOrderCopiesUnderAFloodOfMisses) {
  // 8 slots for 64 experts, 2 staging buffers: every acquire misses, slots and staging buffers
  // are reused constantly; a slot read before its copy landed would fail the checksum.
  auto d = start({"--backend", "cuda", "--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4",
                  "--stage-slots", "2"});
  ASSERT_TRUE(d->alive());
  auto [rc, out] = run(probe(0, 6, 4) + " 2>&1");
  EXPECT_EQ(rc, 0) << out << d->log();
  EXPECT_EQ(out, "ok " + std::to_string(6 * kExperts) + "\n");
  auto c = connect();
  ASSERT_TRUE(c);
  EXPECT_GE(stat(*c, "cache_misses"), 6 * kExperts - 8);
  EXPECT_EQ(stat(*c, "h2d_bytes"), stat(*c, "pack_read_bytes"));
  EXPECT_EQ(stat(*c, "copy_errors"), 0);
}

TEST_F(GpuArenaTest, ClientDyingWithLeasesFreesThemForOthers) {
  auto d = start({"--backend", "cuda", "--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4"});
  ASSERT_TRUE(d->alive());
  {
    auto c = connect();
    ASSERT_TRUE(c);
    auto l = c->acquire(0, std::vector<uint32_t>{0, 1, 2, 3});
    ASSERT_TRUE(l) << l.error().message;
    ASSERT_TRUE(c->wait_ready(*l));
  }  // dies holding the lease: the daemon must release it
  auto [rc, out] = run(probe(1, 1, 4) + " 2>&1");
  EXPECT_EQ(rc, 0) << out << d->log();
  EXPECT_TRUE(d->alive());
}

TEST_F(GpuArenaTest, ArenaTooSmallForOneWorkingSetPerClientIsAClearStartupError) {
  Daemon d(manifest_path(), socket(), {"--backend", "cuda", "--cache-slots", "3", "--clients-max", "2", "--max-experts-per-request", "4"});
  std::string log;
  EXPECT_FALSE(d.start(&log));
  EXPECT_NE(log.find("needed for one working set per client"), std::string::npos) << log;
}

}  // namespace
}  // namespace expertd::test
