// Fuzz entries beyond GGUF (tests/gguf/gguf_fuzz_target.cpp): the frame reader + flatbuffers
// verifier + the fields the daemon's handlers read, the manifest JSON loader, the pack header.
// Each is a libFuzzer target with -DEXPERTD_FUZZ=ON (clang) and is driven by seeded mutations
// in the normal test suite (fuzz_seeded_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace expertd::fuzz {

int frames(const uint8_t* data, size_t size);
int manifest(const uint8_t* data, size_t size);
int pack_header(const uint8_t* data, size_t size);

// Valid inputs of each kind: the seed corpus (also written to tests/data/fuzz/ by the seeded test
// when EXPERTD_WRITE_FUZZ_CORPUS names a directory).
std::vector<std::string> frame_seeds();
std::vector<std::string> manifest_seeds();
std::vector<std::string> pack_header_seeds();

}  // namespace expertd::fuzz
