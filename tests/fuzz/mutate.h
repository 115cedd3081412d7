// Seeded mutations for the fuzz entries' drivers in the normal test suite: bit flips,
// truncations, hostile integers, random runs and duplicated slices.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>

namespace expertd::fuzz {

inline std::string mutate(std::string m, std::mt19937_64& rng) {
  if (m.empty()) return m;
  switch (rng() % 5) {
    case 0:  // flip bits
      for (int k = 0; k < 1 + int(rng() % 8); ++k)
        m[rng() % m.size()] ^= static_cast<char>(1u << (rng() % 8));
      break;
    case 1:  // truncate
      m.resize(rng() % m.size());
      break;
    case 2: {  // a hostile integer at a random position
      uint64_t v = rng() % 2 ? ~0ull >> (rng() % 64) : rng();
      size_t at = rng() % m.size();
      std::memcpy(m.data() + at, &v, std::min<size_t>(rng() % 2 ? 4 : 8, m.size() - at));
      break;
    }
    case 3:  // a random run
      for (size_t at = rng() % m.size(), n = 1 + rng() % 32; n-- && at < m.size(); ++at)
        m[at] = static_cast<char>(rng());
      break;
    default: {  // duplicate a slice (JSON: repeated keys and brackets; frames: stuttering)
      size_t at = rng() % m.size(), n = std::min<size_t>(1 + rng() % 64, m.size() - at);
      m.insert(rng() % m.size(), m.substr(at, n));
    }
  }
  return m;
}

}  // namespace expertd::fuzz
