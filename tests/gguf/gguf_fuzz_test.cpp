// Seeded mutations of real GGUF files through the fuzz entry: bit flips, truncations and
// hostile integers at header positions must give errors, never a crash or a hang.
#include <cstring>
#include <random>

#include "test_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

using namespace expertd::test;

TEST(GgufFuzz, SeededMutationsNeverCrash) {
  std::vector<std::string> seeds = {read_file(std::string(EXPERTD_SOURCE_DIR) +
                                              "/tests/data/tokenizer/ggml-vocab-synth-qwen2.gguf")};
  if (std::filesystem::exists(golden_model("qwen3moe-A-s1-q8_0")))
    seeds.push_back(read_file(golden_model("qwen3moe-A-s1-q8_0")));
  std::mt19937_64 rng(20261201);
  int runs = 0;
  for (const auto& seed : seeds) {
    ASSERT_GT(seed.size(), 1000u);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(seed.data()),
                           seed.size());  // the valid file itself
    for (int i = 0; i < 600; ++i, ++runs) {
      std::string m = seed;
      size_t header = std::min<size_t>(m.size(), 64 * 1024);  // where the structure lives
      switch (rng() % 4) {
        case 0:  // flip bits in the header region
          for (int k = 0; k < 1 + int(rng() % 8); ++k)
            m[rng() % header] ^= static_cast<char>(1u << (rng() % 8));
          break;
        case 1:  // truncate
          m.resize(rng() % m.size());
          break;
        case 2: {  // a hostile 64-bit value at a random aligned header position
          uint64_t v = rng() % 2 ? ~0ull >> (rng() % 64) : rng();
          size_t at = (rng() % (header / 8)) * 8;
          std::memcpy(m.data() + at, &v, std::min<size_t>(8, m.size() - at));
          break;
        }
        default:  // overwrite a run with random bytes
          for (size_t at = rng() % header, n = 1 + rng() % 64; n-- && at < m.size(); ++at)
            m[at] = static_cast<char>(rng());
      }
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(m.data()), m.size());
    }
  }
  EXPECT_GE(runs, 600);
}
