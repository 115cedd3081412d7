// The host arena in 2 MiB pages: expertd maps it 2 MiB-aligned and advised to transparent huge
// pages before faulting it in, engines map it the same way, and where the host keeps shared memory
// in 4 KiB pages (shmem_enabled "never", Debian's default) the daemon says so at start and its
// counters show it. Which branch runs depends on the host's setting; each asserts what it implies.
#include <nlohmann/json.hpp>

#include "common/fd.h"
#include "common/shared_map.h"
#include "daemon/fixture.h"

using namespace expertd;
using namespace expertd::test;

namespace {

// The VmFlags line of this process's mapping that starts at `start` ("" if there is none).
std::string vm_flags(const void* start) {
  char want[32];
  std::snprintf(want, sizeof want, "%lx-",
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(start)));
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    if (line.rfind(want, 0) == 0)
      in = true;
    else if (in && line.rfind("VmFlags:", 0) == 0)
      return line + " ";
  }
  return "";
}

// The fixture's model with 4x wider experts (~0.8 MiB each): every expert in slots makes an
// arena past the 32 MiB below which the daemon does not warn about its pages.
class BigArena : public ::testing::Test {
 protected:
  void SetUp() override {
    manifest_ = write_packed_synth(dir_, 1024);
    ASSERT_FALSE(manifest_.empty());
  }
  std::unique_ptr<Daemon> start(std::vector<std::string> flags) {
    auto d = std::make_unique<Daemon>(manifest_, socket(), flags);
    std::string log;
    EXPECT_TRUE(d->start(&log)) << log;
    return d;
  }
  std::string socket() const { return dir_ / "s.sock"; }
  std::unique_ptr<client::Client> connect() {
    auto c = client::Client::connect(socket(), {"test", 20000});
    EXPECT_TRUE(c) << (c ? "" : c.error().message);
    return c ? std::move(*c) : nullptr;
  }
  TempDir dir_;
  std::string manifest_;
};

bool host_gives_shared_huge_pages() {
  const std::string p = shmem_thp_policy();
  return p == "advise" || p == "always" || p == "within_size" || p == "force";
}

}  // namespace

TEST_F(BigArena, HostArenaIsInHugePagesOrSaysWhyNot) {
  auto d = start({"--cache-slots", "64", "--clients-max", "2"});
  const std::string log = d->log();
  auto c = connect();
  ASSERT_TRUE(c);
  const uint64_t arena = c->info().arena_bytes;
  ASSERT_GE(arena, uint64_t{32} << 20);
  const double huge = metric(*c, "arena_huge_bytes");
  if (host_gives_shared_huge_pages()) {
    // Every whole 2 MiB page of the arena (its tail may be smaller).
    EXPECT_EQ(huge, double(arena / kHugePage * kHugePage)) << shmem_thp_policy();
    EXPECT_EQ(log.find("4 KiB pages"), std::string::npos) << log;
  } else {
    EXPECT_EQ(huge, 0);
    EXPECT_NE(log.find("the arena is in 4 KiB pages"), std::string::npos) << log;
    EXPECT_NE(log.find("shmem_enabled is '" + shmem_thp_policy() + "'"), std::string::npos) << log;
    EXPECT_NE(log.find("expertd-thp.conf"), std::string::npos) << log;
  }
  // The engine's mapping: aligned, advised, and (where the host allows) in huge pages once read.
  const uint8_t* a = c->arena();
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kHugePage, 0u);
  EXPECT_NE(vm_flags(a).find(" hg "), std::string::npos) << vm_flags(a);
  for (uint64_t o = 0; o < arena; o += 4096) (void)*static_cast<const volatile uint8_t*>(a + o);
  if (host_gives_shared_huge_pages())
    EXPECT_GE(huge_mapped_bytes(a), arena / kHugePage * kHugePage);
  else
    EXPECT_EQ(huge_mapped_bytes(a), 0u);
  auto [rc, out] = run(bin("client/expertctl") + " --socket " + socket() + " status");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("pages     " + std::to_string(uint64_t(huge) >> 20) + " of " +
                     std::to_string(arena >> 20) + " MiB in 2 MiB pages"),
            std::string::npos)
      << out;
}

TEST_F(BigArena, HugePagesFalseKeepsTheArenaInSmallPagesWithoutAWarning) {
  auto d = start({"--cache-slots", "64", "--clients-max", "2", "--huge-pages", "false"});
  auto c = connect();
  ASSERT_TRUE(c);
  EXPECT_EQ(metric(*c, "arena_huge_bytes"), 0);
  EXPECT_EQ(d->log().find("4 KiB pages"), std::string::npos) << d->log();
  c.reset();
  EXPECT_EQ(d->stop(), 0);
  // A small arena (8 slots, ~6.5 MiB) is not worth a warning whatever its pages.
  d = start({"--cache-slots", "8", "--clients-max", "1"});
  c = connect();
  ASSERT_TRUE(c);
  EXPECT_EQ(d->log().find("4 KiB pages"), std::string::npos) << d->log();
}

// The mapping helper alone: aligned, the same bytes as another mapping of the descriptor, and
// advised only when asked.
TEST(SharedMap, AlignedSharedAndAdvisedOnlyWhenAsked) {
  UniqueFd fd(::memfd_create("shared-map-test", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  const uint64_t bytes = 3 * kHugePage + 4096;
  ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  for (bool huge : {true, false}) {
    auto w = map_shared_aligned(fd.get(), bytes, PROT_READ | PROT_WRITE, huge);
    ASSERT_TRUE(w) << w.error().message;
    auto r = map_shared_aligned(fd.get(), bytes, PROT_READ, huge);
    ASSERT_TRUE(r) << r.error().message;
    auto* wp = static_cast<uint8_t*>(*w);
    const auto* rp = static_cast<const uint8_t*>(*r);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(wp) % kHugePage, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(rp) % kHugePage, 0u);
    wp[0] = 7, wp[bytes - 1] = huge ? 9 : 11;
    EXPECT_EQ(rp[0], 7);
    EXPECT_EQ(rp[bytes - 1], huge ? 9 : 11);
    EXPECT_EQ(vm_flags(wp).find(" hg ") != std::string::npos, huge) << vm_flags(wp);
    EXPECT_EQ(vm_flags(rp).find(" hg ") != std::string::npos, huge) << vm_flags(rp);
    // Nothing of the reserved span is left mapped around it.
    EXPECT_EQ(vm_flags(wp + bytes), "");
    ::munmap(wp, bytes);
    ::munmap(const_cast<uint8_t*>(rp), bytes);
  }
}
