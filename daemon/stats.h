// The daemon's counters and latency histograms; to_metrics() is the one registry every
// consumer renders (expertctl stats table/JSON/Prometheus, the periodic stats file).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "proto/metrics.h"

namespace expertd::daemon {

using proto::Histogram;  // microseconds here

struct Counters {
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;
  uint64_t cache_miss_joined = 0;  // misses that joined a read already LOADING
  uint64_t cache_evictions = 0;
  uint64_t pack_read_bytes = 0;
  uint64_t pack_reads = 0;
  uint64_t fallback_count = 0;  // always 0: there is no fallback path; kept for SGLang users
  uint64_t io_errors = 0;
  uint64_t checksum_errors = 0;
  uint64_t prefetch_issued = 0;
  uint64_t prefetch_used = 0;
  uint64_t prefetch_wasted = 0;
  uint64_t prefetch_dropped = 0;   // hints not acted on (no free slot, demand waiting)
  uint64_t prefetch_rejected = 0;  // hints whose expert was colder than the slot it would evict
  uint64_t announced_reads = 0;    // misses read ahead of their acquire (Prefetch will_acquire)
  uint64_t announced_lost = 0;     // of those, evicted before the acquire came
  uint64_t warm_reads = 0;
  uint64_t host_hits = 0;       // VRAM misses copied up from the host tier, not read
  uint64_t host_demotions = 0;  // experts evicted from VRAM copied down into the host tier
  uint64_t host_evictions = 0;  // experts dropped from the host tier for room
  uint64_t acquires = 0;
  uint64_t board_acquires = 0;   // of those, served from the residency board: no round trip
  uint64_t board_ring_lost = 0;  // ring words of an engine that wrote past the daemon's tail
  uint64_t acquire_waits = 0;    // acquires that waited for free slots
  uint64_t acquire_timeouts = 0;
  uint64_t releases = 0;
  uint64_t waves = 0;          // acquires of more experts than one wave pins
  uint64_t dones = 0;          // Done messages: a wave's pins handed back
  uint64_t client_errors = 0;  // malformed frames, bad requests
  uint64_t clients_connected_total = 0;
  uint64_t clients_refused = 0;  // over a limit, or not an allowed peer
  uint64_t hello_timeouts = 0;   // closed for not saying Hello in time
  uint64_t draft_steps = 0;      // engines' DraftReports: speculative verify evals
  uint64_t draft_tokens = 0;     // drafts verified
  uint64_t draft_accepted = 0;   // drafts kept
};

struct Gauges {
  uint64_t clients = 0;   // engines
  uint64_t monitors = 0;  // expertctl connections
  uint64_t pending = 0;   // connections that have not said Hello yet
  uint64_t leases = 0;
  uint64_t slot_count = 0;
  uint64_t arena_huge_bytes = 0;  // host arena bytes in 2 MiB pages
  uint64_t slots_used = 0;
  uint64_t slots_loading = 0;
  uint64_t slots_pinned = 0;
  uint64_t bytes_in_flight = 0;
  uint64_t bytes_in_flight_max = 0;
  uint64_t io_queued = 0;
  uint64_t acquires_waiting = 0;
  uint64_t h2d_bytes = 0;
  uint64_t copy_errors = 0;
  uint64_t d2h_bytes = 0;
  uint64_t host_slot_count = 0;
  uint64_t host_slots_used = 0;
  uint64_t stage_waits = 0;
  uint64_t reads_deferred = 0;
  uint64_t uptime_s = 0;
};

struct Stats {
  Counters c;
  Histogram acquire_latency_us;  // request received -> last expert ready
  Histogram read_latency_us;     // read submitted -> bytes verified
  std::vector<uint64_t> layer_hits, layer_misses;
  // Per (layer, expert), layer-major: the dashboards' heat map (ExpertsRequest). Plain counters:
  // the control thread is their only writer and reader.
  std::vector<uint64_t> expert_hits, expert_misses;

  void reset(size_t n_layers, uint32_t n_experts);
  // An acquired expert counted everywhere it counts: cache_*, the layer's and the expert's.
  void hit(uint32_t layer, uint32_t expert) {
    ++c.cache_hits;
    ++layer_hits[layer];
    ++expert_hits[size_t{layer} * n_experts_ + expert];
  }
  void miss(uint32_t layer, uint32_t expert) {
    ++c.cache_misses;
    ++layer_misses[layer];
    ++expert_misses[size_t{layer} * n_experts_ + expert];
  }
  std::vector<proto::Metric> to_metrics(const Gauges& g) const;

 private:
  uint32_t n_experts_ = 0;
};

}  // namespace expertd::daemon
