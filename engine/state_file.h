// A sequence's state in a file (expert-run --prompt-cache, as llama.cpp's flag of that name):
// the tokens it was computed from and the state after them, tied to the model by an identity
// (the model file's size and first 16 MiB), checked by an xxh3 checksum, written atomically.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/engine.h"

namespace engine {

// The identity of the model file at `path` with the cache type its states are kept in and whether
// they carry its NextN block's cache (another file's states, or another kind's, are refused).
expertd::Result<uint64_t> model_identity(const std::string& path, KvType kv = KvType::F32,
                                         bool nextn = false);

struct StateFile {
  std::vector<int32_t> tokens;
  SeqState state;
};
expertd::Status save_state_file(const std::string& path, uint64_t model_id,
                                std::span<const int32_t> tokens, const SeqState& s);
// An error names the cause: not a state file, another model's, damaged or truncated.
expertd::Result<StateFile> load_state_file(const std::string& path, uint64_t model_id);

}  // namespace engine
