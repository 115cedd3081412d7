// expertd --backend cuda with real engine processes: the slot arena shared over a CUDA IPC
// memory handle by two processes at once, and slots published only through their interprocess
// events while a flood of misses recycles slots and a two-buffer staging ring.
// Also built against the CPU emulation of the CUDA runtime (tests/cuda_emu): there the daemon is
// expertd_emu and the engine gpu_probe_emu, the arena shared memory opened through emulated IPC;
// copies complete at once there, so only a GPU tests the events' ordering.
#include <algorithm>
#include <nlohmann/json.hpp>

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
  auto d = start(
      {"--backend", "cuda", "--cache-slots", "64", "--clients-max", "3", "--stage-slots", "4"});
  ASSERT_TRUE(d->alive());
  // Two engine processes at once, one per layer, each checking every byte it reads from VRAM.
  auto [rc, out] = run("(" + probe(0, 2, 4) + " > " + local_ / "a.out" + " 2>&1 & " +
                       probe(1, 2, 4) + " > " + local_ / "b.out" + " 2>&1 & wait %1 && wait %2)");
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
  auto d = start({"--backend", "cuda", "--cache-slots", "8", "--clients-max", "2",
                  "--max-experts-per-request", "4", "--stage-slots", "2"});
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
  auto d = start({"--backend", "cuda", "--cache-slots", "8", "--clients-max", "2",
                  "--max-experts-per-request", "4"});
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

// A pinned host tier under the VRAM slots: 8 VRAM slots for 32 experts walked six times, every
// acquire a VRAM miss. With 32 host slots each expert is read from the drive once; later misses
// are copied up from host memory (evicted ones copied down), and the engine process checks every
// byte it reads from VRAM. With 8 host slots (16 in all for 32) the host tier evicts and the
// drive is read again.
TEST_F(GpuArenaTest, AHostTierUnderVramServesEvictedExpertsWithoutReads) {
  for (const char* host_slots : {"32", "8"}) {
    auto d = start({"--backend", "cuda", "--cache-slots", "8", "--host-cache-slots", host_slots,
                    "--clients-max", "2", "--max-experts-per-request", "4", "--stage-slots", "2",
                    "--policy", "lru"});
    ASSERT_TRUE(d->alive());
    auto [rc, out] = run(probe(0, 6, 4) + " 2>&1");
    EXPECT_EQ(rc, 0) << out << d->log();
    EXPECT_EQ(out, "ok " + std::to_string(6 * kExperts) + "\n");
    auto c = connect();
    ASSERT_TRUE(c);
    const double reads = stat(*c, "pack_reads"), host_hits = stat(*c, "host_hits");
    EXPECT_EQ(stat(*c, "host_slot_count"), std::stod(host_slots));
    EXPECT_EQ(stat(*c, "cache_misses"), 6 * kExperts);  // LRU, cyclic walk: no VRAM hit
    EXPECT_EQ(reads + host_hits, 6 * kExperts);         // each miss read or copied up
    EXPECT_EQ(stat(*c, "h2d_bytes"), (reads + host_hits) * stride());
    EXPECT_EQ(stat(*c, "d2h_bytes"), stat(*c, "host_demotions") * stride());
    EXPECT_EQ(stat(*c, "copy_errors"), 0);
    EXPECT_EQ(stat(*c, "io_errors"), 0);
    if (std::string(host_slots) == "32") {
      EXPECT_EQ(reads, kExperts);  // read from the drive once
      EXPECT_EQ(host_hits, 5 * kExperts);
      EXPECT_EQ(stat(*c, "host_evictions"), 0);
      // The dashboards' snapshot: 8 of the layer in VRAM, the other 24 in the host tier.
      auto j = c->experts_json();
      ASSERT_TRUE(j) << j.error().message;
      const auto snap = nlohmann::json::parse(*j);
      EXPECT_EQ(snap["tiers"], "vram+host");
      const std::string r = snap["layers"][0]["resident"];
      EXPECT_EQ(std::count(r.begin(), r.end(), 'V'), 8) << r;
      EXPECT_EQ(std::count(r.begin(), r.end(), 'H'), kExperts - 8) << r;
      uint64_t misses = 0;
      for (const auto& m : snap["layers"][0]["misses"]) misses += m.get<uint64_t>();
      EXPECT_EQ(misses, 6 * kExperts);
    } else {
      EXPECT_GT(stat(*c, "host_evictions"), 0);
      EXPECT_EQ(reads, 6 * kExperts);  // the cyclic walk outruns 16 slots: LRU keeps nothing
    }
    c.reset();
    EXPECT_EQ(d->stop(), 0);
  }
}

TEST_F(GpuArenaTest, ArenaTooSmallForOneWorkingSetPerClientIsAClearStartupError) {
  Daemon d(manifest_path(), socket(),
           {"--backend", "cuda", "--cache-slots", "3", "--clients-max", "2",
            "--max-experts-per-request", "4"});
  std::string log;
  EXPECT_FALSE(d.start(&log));
  EXPECT_NE(log.find("needed for one working set per client"), std::string::npos) << log;
}

#ifdef EXPERTD_CUDA_EMULATION
// Faults that only the emulation can inject (tests/cuda_emu/include/cuda_runtime.h).
TEST_F(GpuArenaTest, ACopyErrorIsReportedCountedAndTheExpertLoadsOnTheNextAcquire) {
  ::setenv("CUDA_EMU_FAIL_H2D", "3", 1);  // the daemon's third copy into the arena fails
  auto d = start({"--backend", "cuda", "--cache-slots", "16", "--clients-max", "2",
                  "--max-experts-per-request", "4"});
  ::unsetenv("CUDA_EMU_FAIL_H2D");
  ASSERT_TRUE(d->alive());
  auto c = connect();
  ASSERT_TRUE(c);
  const std::vector<uint32_t> ids = {0, 1, 2, 3};
  auto l = c->acquire(0, ids);
  ASSERT_TRUE(l) << l.error().message;
  for (;;) {
    auto r = c->next_ready(*l);
    ASSERT_TRUE(r) << r.error().message;
    if (!r->has_value()) break;
  }
  size_t failed = 0;
  for (const auto& e : l->errors)
    if (!e.empty()) {
      ++failed;
      EXPECT_NE(e.find("to the GPU"), std::string::npos) << e;
      EXPECT_NE(e.find("fault injected"), std::string::npos) << e;
    }
  EXPECT_EQ(failed, 1u);
  ASSERT_TRUE(c->release(*l));
  // The daemon serves on, and the failed expert is read and copied again.
  auto l2 = c->acquire(0, ids);
  ASSERT_TRUE(l2) << l2.error().message;
  EXPECT_TRUE(c->wait_ready(*l2));
  ASSERT_TRUE(c->release(*l2));
  EXPECT_EQ(stat(*c, "copy_errors"), 1);
  EXPECT_EQ(stat(*c, "io_errors"), 1);
  auto [rc, out] = run(probe(0, 1, 4) + " 2>&1");  // every expert's bytes in the arena, checked
  EXPECT_EQ(rc, 0) << out << d->log();
}

TEST_F(GpuArenaTest, AnIpcOpenThatIsRefusedIsAClearErrorAndOthersAreServed) {
  auto d = start({"--backend", "cuda", "--cache-slots", "16", "--clients-max", "3",
                  "--max-experts-per-request", "4"});
  ASSERT_TRUE(d->alive());
  ::setenv("CUDA_EMU_DENY_IPC", "1", 1);  // as in a container without the rights
  auto [rc, out] = run(probe(0, 1, 4) + " 2>&1");
  ::unsetenv("CUDA_EMU_DENY_IPC");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("cudaIpcOpenMemHandle"), std::string::npos) << out;
  EXPECT_NE(out.find("IPC permitted in the container"), std::string::npos) << out;
  auto [rc2, out2] = run(probe(1, 1, 4) + " 2>&1");
  EXPECT_EQ(rc2, 0) << out2 << d->log();
  EXPECT_TRUE(d->alive());
}
#endif  // EXPERTD_CUDA_EMULATION

}  // namespace
}  // namespace expertd::test
