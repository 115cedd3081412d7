// Seeded mutations of valid frames, manifests and pack headers through the fuzz entries: bit
// flips, truncations, hostile integers and random runs must give errors, never a crash, a hang
// or a broken invariant (the entries abort on those). With EXPERTD_WRITE_FUZZ_CORPUS=DIR the
// seeds are written there as libFuzzer corpora (tests/data/fuzz/ holds them).
#include <fstream>

#include "fuzz/fuzz_targets.h"
#include "fuzz/mutate.h"
#include "test_util.h"

using namespace expertd;

namespace {

void run(const char* what, int (*entry)(const uint8_t*, size_t),
         const std::vector<std::string>& seeds, uint64_t seed, int per_seed) {
  if (const char* dir = std::getenv("EXPERTD_WRITE_FUZZ_CORPUS")) {
    std::filesystem::create_directories(std::string(dir) + "/" + what);
    for (size_t i = 0; i < seeds.size(); ++i)
      std::ofstream(std::string(dir) + "/" + what + "/seed-" + std::to_string(i), std::ios::binary)
          << seeds[i];
  }
  std::mt19937_64 rng(seed);
  int runs = 0;
  for (const auto& s : seeds) {
    ASSERT_FALSE(s.empty());
    entry(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    std::string m = s;
    for (int i = 0; i < per_seed; ++i, ++runs) {
      m = i % 4 == 0 ? fuzz::mutate(s, rng)
                     : fuzz::mutate(m, rng);  // fresh, or stacked on the last one
      entry(reinterpret_cast<const uint8_t*>(m.data()), m.size());
    }
  }
  EXPECT_GE(runs, per_seed) << what;
}

}  // namespace

TEST(ProtoFuzz, SeededFrameMutationsNeverCrash) {
  run("frames", fuzz::frames, fuzz::frame_seeds(), 20261201, 1500);
}

TEST(ProtoFuzz, SeededManifestMutationsNeverCrash) {
  run("manifest", fuzz::manifest, fuzz::manifest_seeds(), 20261202, 3000);
}

TEST(ProtoFuzz, SeededPackHeaderMutationsNeverCrash) {
  run("pack_header", fuzz::pack_header, fuzz::pack_header_seeds(), 20261203, 3000);
}
