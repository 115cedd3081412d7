// Offline cache simulation over an expertd trace (--trace-path): the daemon's policies and the
// offline optimum (Belady: evict the expert whose next use is farthest) as the yardstick.
// The daemon's policies replay through the real Cache (daemon/cache_sim.h: no drive, no memory),
// so a trace replayed with the daemon's policy and slot count reproduces its hits (tested);
// Belady and the horizon policies, which see the coming accesses, and the lab's follow the
// Cache's order of events in replays of their own.
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
// "sieve", "s3fifo", "arc", "2q", "lecar"), or "lfru+hH" (H = 0, 1, ...): the knowledge horizon,
// lfru that also knows the routing of the rest of the current step and of the next H steps, and
// keeps an expert used within them over any other (the farthest such use evicted first). A step
// (a token's forward pass) starts at a record whose layer is below its predecessor's. What it
// gains over lfru bounds what predicting that much of the routing can gain; with a horizon past
// the trace's end it is Belady. "lfru+affinity": lfru whose count of an expert of a layer still to
// come in the current step is raised by 8x the chance that the step uses it, a naive-Bayes
// estimate from the experts the step used at its earlier layers, with the layers' co-occurrence
// learned online from the steps before (daemon/affinity.h; the daemon's --policy lfru+affinity).
Result<SimResult> simulate(const Trace& t, uint32_t slots, const std::string& policy);
std::vector<std::string> lab_policy_names();

}  // namespace expertd::daemon
