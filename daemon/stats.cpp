#include "daemon/stats.h"

#include <bit>
#include <cmath>
#include <string>

namespace expertd::daemon {

void Stats::reset(size_t n_layers, uint32_t n_experts) {
  c = Counters{};
  acquire_latency_us.reset();
  read_latency_us.reset();
  layer_hits.assign(n_layers, 0);
  layer_misses.assign(n_layers, 0);
  n_experts_ = n_experts;
  expert_hits.assign(n_layers * n_experts, 0);
  expert_misses.assign(n_layers * n_experts, 0);
}

std::vector<proto::Metric> Stats::to_metrics(const Gauges& g) const {
  using proto::MetricKind;
  std::vector<proto::Metric> m;
  auto counter = [&](const char* n, uint64_t v, const char* unit, const char* help) {
    m.push_back({n, unit, help, MetricKind::Counter, static_cast<double>(v)});
  };
  auto gauge = [&](const std::string& n, double v, const char* unit, const std::string& help) {
    m.push_back({n, unit, help, MetricKind::Gauge, v});
  };
  counter("cache_hits", c.cache_hits, "", "experts ready in a slot when acquired");
  counter("cache_misses", c.cache_misses, "", "experts not ready when acquired");
  counter("cache_miss_joined", c.cache_miss_joined, "", "misses that joined a read in progress");
  counter("cache_evictions", c.cache_evictions, "", "ready experts evicted to make room");
  counter("pack_read_bytes", c.pack_read_bytes, "bytes", "bytes read from the pack (O_DIRECT)");
  counter("pack_reads", c.pack_reads, "", "expert blocks read from the pack");
  counter("h2d_bytes", g.h2d_bytes, "bytes", "bytes copied host to device (cuda arena)");
  counter("copy_errors", g.copy_errors, "", "failed copies to or from the GPU (cuda arena)");
  counter("d2h_bytes", g.d2h_bytes, "bytes",
          "bytes copied device to host: experts demoted into the host tier (cuda arena)");
  counter("host_hits", c.host_hits, "", "VRAM misses copied up from the host tier, not read");
  counter("host_demotions", c.host_demotions, "",
          "experts evicted from VRAM copied down into the host tier");
  counter("host_evictions", c.host_evictions, "", "experts dropped from the host tier for room");
  counter("stage_waits", g.stage_waits, "",
          "reads that waited for a staging buffer's copy (cuda arena)");
  counter("fallback_count", c.fallback_count, "",
          "reads served by a fallback path (there is none)");
  counter("io_errors", c.io_errors, "", "failed expert reads (I/O or checksum)");
  counter("checksum_errors", c.checksum_errors, "", "reads whose bytes failed the xxh3 check");
  counter("prefetch_issued", c.prefetch_issued, "", "prefetch reads started");
  counter("prefetch_used", c.prefetch_used, "", "prefetched experts later acquired");
  counter("prefetch_wasted", c.prefetch_wasted, "", "prefetched experts evicted unused");
  counter("prefetch_dropped", c.prefetch_dropped, "", "prefetch hints not acted on");
  counter("prefetch_rejected", c.prefetch_rejected, "",
          "prefetch hints colder than the expert they would evict");
  counter("announced_reads", c.announced_reads, "",
          "misses read ahead of their acquire: the rest of a layer a client is about to acquire");
  counter("announced_lost", c.announced_lost, "",
          "announced experts evicted before their acquire came");
  counter("warm_reads", c.warm_reads, "",
          "experts read at start from an earlier run's popularity (--state-path)");
  counter("acquires", c.acquires, "", "acquire requests granted");
  counter("board_acquires", c.board_acquires, "",
          "acquires an engine served itself from the residency board, without a round trip");
  counter("board_ring_lost", c.board_ring_lost, "",
          "board ring words lost (an engine wrote past the daemon's tail; its hits uncounted)");
  counter("waves", c.waves, "",
          "acquires of more experts than max_experts_per_request, granted in waves");
  counter("dones", c.dones, "", "Done messages: experts of a lease handed back for its next wave");
  counter("acquire_waits", c.acquire_waits, "", "acquires that waited for free slots");
  counter("acquire_timeouts", c.acquire_timeouts, "", "acquires that waited too long");
  counter("releases", c.releases, "", "leases released");
  counter("client_errors", c.client_errors, "", "malformed frames or bad requests");
  counter("clients_connected_total", c.clients_connected_total, "", "connections accepted");
  counter("clients_refused", c.clients_refused, "",
          "connections refused: over a limit, or not an allowed peer");
  counter("hello_timeouts", c.hello_timeouts, "",
          "connections closed for not saying Hello in time");
  counter("draft_steps", c.draft_steps, "",
          "engines' speculative verify evals (a pending token and its drafts), as they report");
  counter("draft_tokens", c.draft_tokens, "", "engines' draft tokens verified");
  counter("draft_accepted", c.draft_accepted, "", "engines' draft tokens kept");
  gauge("draft_acceptance",
        c.draft_tokens ? double(c.draft_accepted) / double(c.draft_tokens) : 0.0, "ratio",
        "draft_accepted / draft_tokens");
  gauge("clients", static_cast<double>(g.clients), "", "engines connected");
  gauge("monitors", static_cast<double>(g.monitors), "", "monitor (expertctl) connections");
  gauge("pending", static_cast<double>(g.pending), "", "connections that have not said Hello yet");
  gauge("leases", static_cast<double>(g.leases), "", "leases held");
  gauge("slot_count", static_cast<double>(g.slot_count), "", "slots in the arena");
  gauge("arena_huge_bytes", static_cast<double>(g.arena_huge_bytes), "bytes",
        "host arena bytes in 2 MiB pages (--huge-pages, the host's shmem_enabled)");
  gauge("slots_used", static_cast<double>(g.slots_used), "", "slots holding or loading an expert");
  gauge("slots_loading", static_cast<double>(g.slots_loading), "", "slots being read");
  gauge("host_slot_count", static_cast<double>(g.host_slot_count), "",
        "host tier slots under VRAM (--host-cache-mib)");
  gauge("host_slots_used", static_cast<double>(g.host_slots_used), "",
        "host tier slots holding an expert");
  gauge("slots_pinned", static_cast<double>(g.slots_pinned), "",
        "slots pinned by leases or from the board");
  gauge("reads_deferred", static_cast<double>(g.reads_deferred), "",
        "loads waiting for a free staging buffer (cuda arena)");
  gauge("bytes_in_flight", static_cast<double>(g.bytes_in_flight), "bytes", "read bytes in flight");
  gauge("bytes_in_flight_max", static_cast<double>(g.bytes_in_flight_max), "bytes",
        "high-water mark of bytes in flight");
  gauge("io_queued", static_cast<double>(g.io_queued), "", "read parts waiting for queue room");
  gauge("acquires_waiting", static_cast<double>(g.acquires_waiting), "",
        "acquires waiting for slots");
  uint64_t looked = c.cache_hits + c.cache_misses;
  gauge("hit_rate", looked ? static_cast<double>(c.cache_hits) / static_cast<double>(looked) : 0.0,
        "ratio", "cache_hits / (cache_hits + cache_misses)");
  gauge("uptime_s", static_cast<double>(g.uptime_s), "s", "seconds since start");
  for (const auto& [name, h] : {std::pair{"acquire_latency_us", &acquire_latency_us},
                                {"read_latency_us", &read_latency_us}}) {
    std::string n = name;
    gauge(n + "_p50", static_cast<double>(h->percentile(50)), "us", "median");
    gauge(n + "_p90", static_cast<double>(h->percentile(90)), "us", "90th percentile");
    gauge(n + "_p99", static_cast<double>(h->percentile(99)), "us", "99th percentile");
    gauge(n + "_max", static_cast<double>(h->max()), "us", "maximum");
    gauge(n + "_count", static_cast<double>(h->count()), "", "samples");
  }
  for (size_t l = 0; l < layer_hits.size(); ++l) {
    uint64_t t = layer_hits[l] + layer_misses[l];
    gauge("layer" + std::to_string(l) + "_hit_rate",
          t ? static_cast<double>(layer_hits[l]) / static_cast<double>(t) : 0.0, "ratio",
          "hit rate of pack layer " + std::to_string(l));
  }
  return m;
}

}  // namespace expertd::daemon
