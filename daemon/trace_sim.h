// Offline cache simulation over an expertd trace (--trace-path): the daemon's policies and the
// offline optimum (Belady: evict the expert whose next use is farthest) as the yardstick.
// The simulation follows Cache's order of events exactly, so a trace replayed with the
// daemon's policy and slot count reproduces its hits (tested).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace expertd::daemon {

struct TraceRecord {
  uint64_t time_ns = 0;
  uint32_t client = 0;
  uint32_t layer = 0;
  std::vector<uint32_t> experts;
};

struct Trace {
  uint32_t n_layers = 0, n_experts = 0;
  std::vector<TraceRecord> records;
};

Result<Trace> read_trace(const std::string& path);

struct SimResult {
  uint64_t hits = 0, misses = 0, evictions = 0;
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

// policy: the daemon's ("lru", "lfu", "lfru"), "belady", or one of the lab's (simulation only:
// "sieve", "s3fifo", "arc", "2q", "lecar").
Result<SimResult> simulate(const Trace& t, uint32_t slots, const std::string& policy);
std::vector<std::string> lab_policy_names();

}  // namespace expertd::daemon
