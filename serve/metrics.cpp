#include "serve/metrics.h"

#include <cstdio>

#include "serve/prefix_disk.h"

namespace expertd::serve {

namespace {
std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}
std::string label(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
}  // namespace

void Histogram::observe(double v) {
  std::lock_guard lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v, ++n_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard lk(mu_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + label(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(n_) + "\n";
}

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
  std::string out;
  auto counter = [&](const char* name, const char* help, double v, const char* type = "counter") {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + num(v) + "\n";
  };
  {
    std::lock_guard lk(mu_);
    out +=
        "# HELP expert_serve_requests_total HTTP requests by endpoint and status\n"
        "# TYPE expert_serve_requests_total counter\n";
    for (const auto& [k, v] : requests_)
      out += "expert_serve_requests_total{endpoint=\"" + k.first + "\",status=\"" +
             std::to_string(k.second) + "\"} " + std::to_string(v) + "\n";
  }
  out +=
      "# HELP expert_serve_connections_closed_total connections closed or refused by the front, "
      "by reason\n# TYPE expert_serve_connections_closed_total counter\n";
  for (size_t i = 0; i < closed.size(); ++i)
    out += std::string("expert_serve_connections_closed_total{reason=\"") + closed_name(Closed(i)) +
           "\"} " + std::to_string(closed[i].load()) + "\n";
  out +=
      "# HELP expert_serve_connections open connections: pending (before their first request's "
      "headers and key) and established\n# TYPE expert_serve_connections gauge\n"
      "expert_serve_connections{state=\"pending\"} " +
      std::to_string(connections_pending.load()) +
      "\nexpert_serve_connections{state=\"established\"} " +
      std::to_string(connections_established.load()) + "\n";
  counter("expert_serve_requests_active", "requests being answered (each holds a thread)",
          double(requests_active), "gauge");
  counter("expert_serve_prompt_tokens_total", "prompt tokens evaluated", double(prompt_tokens));
  counter("expert_serve_generated_tokens_total", "tokens generated", double(generated_tokens));
  counter("expert_serve_steps_total", "batched engine steps", double(steps));
  counter("expert_serve_batched_rows_total",
          "sequence rows over all steps (divide by steps: the mean batch)", double(batched_rows));
  counter("expert_serve_queue_length", "requests waiting for a sequence slot", double(queue_length),
          "gauge");
  counter("expert_serve_active_sequences", "sequences in the engine", double(active_sequences),
          "gauge");
  counter("expert_serve_prefix_reused_tokens_total",
          "prompt tokens resumed from the prefix cache instead of computed",
          double(prefix_reused_tokens));
  counter("expert_serve_prefix_hits_total", "requests that resumed a cached prefix",
          double(prefix_hits));
  counter("expert_serve_prefix_disk_hits_total",
          "requests that resumed a prefix read from the SSD tier", double(prefix_disk_hits));
  if (prefix_disk) {
    const auto& c = prefix_disk->counters();
    counter("expert_serve_prefix_disk_writes_total", "prefix states written to the SSD tier",
            double(c.writes));
    counter("expert_serve_prefix_disk_write_bytes_total", "bytes written to the SSD tier",
            double(c.write_bytes));
    counter("expert_serve_prefix_disk_reads_total", "prefix states read from the SSD tier",
            double(c.reads));
    counter("expert_serve_prefix_disk_read_bytes_total", "bytes read from the SSD tier",
            double(c.read_bytes));
    counter("expert_serve_prefix_disk_damaged_total",
            "SSD-tier files whose header, size or checksum failed (a miss; removed)",
            double(c.damaged));
    counter("expert_serve_prefix_disk_evictions_total",
            "SSD-tier files evicted (least recently used)", double(c.evictions));
    counter("expert_serve_prefix_disk_dropped_total",
            "states not written: the write queue was full", double(c.dropped));
    counter("expert_serve_prefix_disk_write_errors_total", "failed SSD-tier writes",
            double(c.write_errors));
    counter("expert_serve_prefix_disk_full", "1: a write met a full disk and writes stopped",
            c.full ? 1.0 : 0.0, "gauge");
    counter("expert_serve_prefix_disk_bytes", "bytes of prefix states on the SSD tier",
            double(prefix_disk->bytes()), "gauge");
    counter("expert_serve_prefix_disk_entries", "prefix states on the SSD tier",
            double(prefix_disk->entries()), "gauge");
  }
  counter("expert_serve_prefix_misses_total", "requests with no cached prefix",
          double(prefix_misses));
  counter("expert_serve_prefix_errors_total",
          "cached prefixes that could not be loaded (the prompt was computed)",
          double(prefix_errors));
  counter("expert_serve_prefix_evictions_total", "prefix states evicted (least recently used)",
          double(prefix_evictions));
  counter("expert_serve_prefix_cache_bytes", "bytes of prefix states in RAM", double(prefix_bytes),
          "gauge");
  counter("expert_serve_prefix_cache_entries", "prefix states in RAM", double(prefix_entries),
          "gauge");
  ttft_s.render(out, "expert_serve_time_to_first_token_seconds",
                "from the request's arrival to its first token");
  token_s.render(out, "expert_serve_time_per_token_seconds", "between a sequence's tokens");
  grammar_mask_s.render(out, "expert_serve_grammar_mask_seconds",
                        "a constrained step's token mask, computed and applied");
  out += proto::render_prometheus(daemon, "expertd_");
  return out;
}

}  // namespace expertd::serve
