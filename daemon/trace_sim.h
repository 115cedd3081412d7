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

// A Prefetch hint the trace recorded, sent before acquire record `before`.
struct TraceHint {
  size_t before = 0;
  uint32_t client = 0, layer = 0;
  std::vector<uint32_t> experts;
};

struct Trace {
  uint32_t n_layers = 0, n_experts = 0;
  std::vector<TraceRecord> records;  // the acquires
  std::vector<TraceHint> hints;      // in order; replayed by the "+hints" policies only
};

Result<Trace> read_trace(const std::string& path);

struct SimResult {
  uint64_t hits = 0, misses = 0, evictions = 0;
  uint64_t prefetch_reads = 0, prefetch_used = 0;  // the "+hints" policies' hints acted on
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
// "P+hints" (P one of the daemon's): P through the Cache with the trace's Prefetch hints
// replayed as the daemon takes them (a hint takes a free slot or evicts only a colder expert;
// "+hints-always", "+hints-spare": --prefetch-admit always, spare); the hints' reads complete
// before the next acquire (no clock: a bound on what they save), and are counted apart from the
// misses. "lfru+drafts": the hints as knowledge of the step they were sent in (speculative
// decoding's draft hints name the experts the drafts' earlier occurrence routed to): lfru that
// keeps an expert hinted for the current step, until it is acquired, over any other, and reads
// nothing more; "lfru+drafts+prefetch" also reads each hinted expert into a free slot or in place
// of an expert no hint named (never evicting a hinted one). A request of more experts than `slots`
// is refused (an error).
Result<SimResult> simulate(const Trace& t, uint32_t slots, const std::string& policy);
// The trace with each request of more experts than `slots` (a speculative verify eval's union
// at a small size) split in waves of `slots`, as the daemon grants it (the engine hands each
// wave back before the next); the hints keep their places.
Trace in_waves(const Trace& t, uint32_t slots);
std::vector<std::string> lab_policy_names();

}  // namespace expertd::daemon
