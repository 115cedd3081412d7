#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>

#include "serve/prefix_cache.h"
#include "serve/prefix_disk.h"

namespace expertd::serve {

const char* closed_name(Closed c) {
  static const char* names[] = {"header_timeout", "body_timeout", "keepalive", "write_timeout",
                                "peer_cap",       "total_cap",    "evicted",   "unauthorized",
                                "busy",           "malformed",    "too_large"};
  static_assert(std::size(names) == size_t(Closed::kCount));
  return names[size_t(c)];
}

void ExpertUse::init(int n_layer, int n_expert) {
  n_layer_ = n_layer, n_expert_ = n_expert;
  counts_ = std::make_unique<std::atomic<uint64_t>[]>(size_t(n_layer) * size_t(n_expert));
}

std::map<std::string, uint64_t> Metrics::requests_by_endpoint() const {
  std::lock_guard lk(mu_);
  std::map<std::string, uint64_t> out;
  for (const auto& [k, v] : requests_) out[k.first] += v;
  return out;
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
  counter("draft_steps", "speculative steps: one batched eval of a pending token and its drafts",
          double(draft_steps));
  counter("draft_tokens", "prompt-lookup drafts verified", double(draft_tokens));
  counter("draft_accepted_tokens", "drafts kept (the target drew the drafted token)",
          double(draft_accepted));
  gauge("queue_length", "requests waiting for a sequence slot", double(queue_length));
  gauge("active_sequences", "sequences in the engine", double(active_sequences));
  gauge("engines_ready", "engine processes connected and serving (1 without --workers)",
        double(engines_ready));
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
  out += render_router_gauges();
  out += proto::render_prometheus(daemon, "expertd_");
  return out;
}

double Metrics::kv_usage() const {
  if (kv_positions_max <= 0) return 0;
  return std::clamp(double(kv_positions) / double(kv_positions_max), 0.0, 1.0);
}

// The names the routers scrape, beside ours (docs/fleet.md). llm-d's endpoint picker (the
// gateway-api-inference-extension EPP: pkg/epp/datalayer/metrics/extractor.go, defaults in
// its model server protocol, docs/proposals/003-model-server-protocol) reads
// vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc (0..1) and the
// labels block_size and num_gpu_blocks of vllm:cache_config_info (a gauge of 1); vLLM writes
// them with labels model_name and engine (vllm/v1/metrics/loggers.py). The same protocol names
// SGLang's: sglang:num_queue_reqs, sglang:num_running_reqs, sglang:token_usage.
// Our KV caches are not paged: a "block" is the prefix cache's index block (PrefixCache::kBlock
// positions), and num_gpu_blocks is every sequence's positions over it, on any device.
std::string Metrics::render_router_gauges() const {
  using proto::MetricKind;
  std::string name;  // a label value: backslash, quote and newline escaped
  for (char c : model_name) {
    if (c == '\\' || c == '"') name += '\\';
    name += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  const std::string labels = "{model_name=\"" + name + "\",engine=\"0\"}";
  const double running = double(active_sequences), waiting = double(queue_length);
  const double usage = kv_usage();
  std::vector<proto::Metric> v{
      {"num_requests_running", "",
       "requests in the engine, prefilling or decoding (expert_serve_active_sequences)",
       MetricKind::Gauge, running, labels},
      {"num_requests_waiting", "", "requests waiting for a sequence (expert_serve_queue_length)",
       MetricKind::Gauge, waiting, labels},
      {"kv_cache_usage_perc", "", "KV positions held by running sequences, of all of them (0..1)",
       MetricKind::Gauge, usage, labels},
      {"cache_config_info", "",
       "1; the KV caches' shape in labels: positions per block, blocks in all", MetricKind::Gauge,
       1,
       "{block_size=\"" + std::to_string(PrefixCache::kBlock) + "\",num_gpu_blocks=\"" +
           std::to_string(kv_positions_max / int64_t(PrefixCache::kBlock)) + "\",engine=\"0\"}"},
      // Speculative decoding under vLLM's names (vllm/v1/spec_decode/metrics.py), for the
      // dashboards written for it.
      {"spec_decode_num_drafts", "", "steps that verified drafts (expert_serve_draft_steps)",
       MetricKind::Counter, double(draft_steps), labels},
      {"spec_decode_num_draft_tokens", "", "drafts verified (expert_serve_draft_tokens)",
       MetricKind::Counter, double(draft_tokens), labels},
      {"spec_decode_num_accepted_tokens", "", "drafts kept (expert_serve_draft_accepted_tokens)",
       MetricKind::Counter, double(draft_accepted), labels}};
  std::string out = proto::render_prometheus(v, "vllm:");
  const std::string sl = "{model_name=\"" + name + "\"}";
  std::vector<proto::Metric> s{
      {"num_running_reqs", "", "requests in the engine (as vllm:num_requests_running)",
       MetricKind::Gauge, running, sl},
      {"num_queue_reqs", "", "requests waiting (as vllm:num_requests_waiting)", MetricKind::Gauge,
       waiting, sl},
      {"token_usage", "", "KV positions in use, 0..1 (as vllm:kv_cache_usage_perc)",
       MetricKind::Gauge, usage, sl}};
  out += proto::render_prometheus(s, "sglang:");
  return out;
}

}  // namespace expertd::serve
