// The cache's popularity (acquires per layer and expert, aged as the policy ages them) saved to
// a state file and read back at start: a restarted daemon ranks experts as before it stopped
// and reads the most popular ones into its free slots while it serves (a warm start).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "proto/pack_format.h"

namespace expertd::daemon {

// Written to PATH.tmp, then renamed: a crash mid-write leaves the previous file.
Status save_popularity(const std::string& path, const pack::Manifest& m,
                       std::span<const uint32_t> frequency);
// Layer-major, one entry per (layer, expert); empty when the file does not exist (a first
// start). An error names the cause: unreadable, malformed, or another model's.
Result<std::vector<uint32_t>> load_popularity(const std::string& path, const pack::Manifest& m);

}  // namespace expertd::daemon
