#include "serve/metrics.h"

#include <cstdio>

#include "serve/prefix_disk.h"

namespace expertd::serve {

const char* closed_name(Closed c) {
  static const char* names[] = {"header_timeout", "body_timeout", "keepalive", "write_timeout",
                                "peer_cap",       "total_cap",    "evicted",   "unauthorized",
                                "busy",           "malformed",    "too_large"};
  static_assert(std::size(names) == size_t(Closed::kCount));
  return names[size_t(c)];
}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{endpoint, status}];
}

std::string Metrics::render(const std::vector<proto::Metric>& daemon) const {
  using proto::MetricKind;
  std::vector<proto::Metric> m;
  auto counter = [&](const char* name, const char* help, double v, std::string labels = "") {
    m.push_back({name, "", help, MetricKind::Counter, v, std::move(labels)});
  };
  auto gauge = [&](const char* name, const char* help, double v, std::string labels = "") {
    m.push_back({name, "", help, MetricKind::Gauge, v, std::move(labels)});
  };
  {
    std::lock_guard lk(mu_);
    for (const auto& [k, v] : requests_)
      counter("requests", "HTTP requests by endpoint and status", double(v),
              "{endpoint=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"}");
  }
  for (size_t i = 0; i < closed.size(); ++i)
    counter("connections_closed", "connections closed or refused by the front, by reason",
            double(closed[i].load()), std::string("{reason=\"") + closed_name(Closed(i)) + "\"}");
  const char* conn_help =
      "open connections: pending (before their first request's headers and key) and established";
  gauge("connections", conn_help, double(connections_pending.load()), "{state=\"pending\"}");
  gauge("connections", conn_help, double(connections_established.load()),
        "{state=\"established\"}");
  gauge("requests_active", "requests being answered (each holds a thread)",
        double(requests_active));
  counter("prompt_tokens", "prompt tokens evaluated", double(prompt_tokens));
  counter("generated_tokens", "tokens generated", double(generated_tokens));
  counter("steps", "batched engine steps", double(steps));
  counter("batched_rows", "sequence rows over all steps (divide by steps: the mean batch)",
          double(batched_rows));
  gauge("queue_length", "requests waiting for a sequence slot", double(queue_length));
  gauge("active_sequences", "sequences in the engine", double(active_sequences));
  counter("prefix_reused_tokens", "prompt tokens resumed from the prefix cache instead of computed",
          double(prefix_reused_tokens));
  counter("prefix_hits", "requests that resumed a cached prefix", double(prefix_hits));
  counter("prefix_disk_hits", "requests that resumed a prefix read from the SSD tier",
          double(prefix_disk_hits));
  if (prefix_disk) {
    const auto& c = prefix_disk->counters();
    counter("prefix_disk_writes", "prefix states written to the SSD tier", double(c.writes));
    counter("prefix_disk_write_bytes", "bytes written to the SSD tier", double(c.write_bytes));
    counter("prefix_disk_reads", "prefix states read from the SSD tier", double(c.reads));
    counter("prefix_disk_read_bytes", "bytes read from the SSD tier", double(c.read_bytes));
    counter("prefix_disk_damaged",
            "SSD-tier files whose header, size or checksum failed (a miss; removed)",
            double(c.damaged));
    counter("prefix_disk_evictions", "SSD-tier files evicted (least recently used)",
            double(c.evictions));
    counter("prefix_disk_dropped", "states not written: the write queue was full",
            double(c.dropped));
    counter("prefix_disk_write_errors", "failed SSD-tier writes", double(c.write_errors));
    gauge("prefix_disk_full", "1: a write met a full disk and writes stopped", c.full ? 1.0 : 0.0);
    gauge("prefix_disk_bytes", "bytes of prefix states on the SSD tier",
          double(prefix_disk->bytes()));
    gauge("prefix_disk_entries", "prefix states on the SSD tier", double(prefix_disk->entries()));
  }
  counter("prefix_misses", "requests with no cached prefix", double(prefix_misses));
  counter("prefix_errors", "cached prefixes that could not be loaded (the prompt was computed)",
          double(prefix_errors));
  counter("prefix_evictions", "prefix states evicted (least recently used)",
          double(prefix_evictions));
  gauge("prefix_cache_bytes", "bytes of prefix states in RAM", double(prefix_bytes));
  gauge("prefix_cache_entries", "prefix states in RAM", double(prefix_entries));
  std::string out = proto::render_prometheus(m, "expert_serve_");
  ttft_s.h.render_prometheus(out, "expert_serve_time_to_first_token_seconds",
                             "from the request's arrival to its first token", 9);
  token_s.h.render_prometheus(out, "expert_serve_time_per_token_seconds",
                              "between a sequence's tokens", 9);
  grammar_mask_s.h.render_prometheus(out, "expert_serve_grammar_mask_seconds",
                                     "a constrained step's token mask, computed and applied", 9);
  out += proto::render_prometheus(daemon, "expertd_");
  return out;
}

}  // namespace expertd::serve
