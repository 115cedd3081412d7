// expert-serve's own counters and latency histograms, rendered as Prometheus text beside
// expertd's counters (GET /metrics).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "proto/metrics.h"

namespace expertd::serve {

// Seconds, kept in nanoseconds in the one latency histogram (proto/metrics.h).
struct SecondsHistogram {
  proto::Histogram h;
  void observe(double seconds) { h.record(seconds > 0 ? static_cast<uint64_t>(seconds * 1e9) : 0); }
};

// Why the front closed or refused a connection (GET /metrics:
// expert_serve_connections_closed_total).
enum class Closed {
  HeaderTimeout,  // request line and headers not in within --header-timeout-s
  BodyTimeout,    // the body not in within --body-timeout-s
  Keepalive,      // idle between requests past --keepalive-s
  WriteTimeout,   // the client stopped reading a response for --write-timeout-s
  PeerCap,        // refused: --peer-connections-max from its address
  TotalCap,       // refused: --max-connections established ones
  Evicted,       // the oldest not-yet-authenticated one, for a newcomer (--pending-connections-max)
  Unauthorized,  // a /v1/ request without the key (answered 401 before its body is read)
  Busy,          // refused: --requests-max requests being answered
  Malformed,     // not HTTP, or headers over their limit (answered 400)
  TooLarge,      // the body over --max-body-mb (answered 413)
  kCount
};
const char* closed_name(Closed c);

// How often the engine's routers chose each expert, per layer, since the start: the dashboard's
// heat map where no expertd reports residency (--local). Sized once at start (no allocation per
// step); relaxed atomics, counted by the engine loop and read by the dashboard.
class ExpertUse {
 public:
  void init(int n_layer, int n_expert);
  int n_layer() const { return n_layer_; }
  int n_expert() const { return n_expert_; }
  void count(int layer, uint32_t expert) {
    if (layer < n_layer_ && expert < uint32_t(n_expert_))
      counts_[size_t(layer) * size_t(n_expert_) + expert].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t at(int layer, int expert) const {
    return counts_[size_t(layer) * size_t(n_expert_) + size_t(expert)].load(
        std::memory_order_relaxed);
  }

 private:
  int n_layer_ = 0, n_expert_ = 0;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
};

struct Metrics {
  std::atomic<uint64_t> prompt_tokens{0}, generated_tokens{0}, steps{0}, batched_rows{0};
  std::atomic<int64_t> queue_length{0}, active_sequences{0};
  // Engine processes connected and serving (--workers; this process's engine without): /health
  // answers once one is, so a client that wants all of them waits for this.
  std::atomic<int64_t> engines_ready{0};
  // The load a gateway weighs (docs/fleet.md): KV positions held by the running sequences, of
  // kv_positions_max in all (engine processes x --parallel x --ctx, set once at start), and the
  // prompt tokens of the requests waiting in the queue.
  std::atomic<int64_t> kv_positions{0}, queued_prompt_tokens{0};
  int64_t kv_positions_max = 0;
  std::string model_name;  // the served id: the vLLM- and SGLang-named gauges' model_name label
  // Prompt prefixes reused (serve/prefix_cache.h).
  std::atomic<uint64_t> prefix_hits{0}, prefix_disk_hits{0}, prefix_misses{0}, prefix_errors{0},
      prefix_reused_tokens{0}, prefix_evictions{0};
  std::atomic<int64_t> prefix_bytes{0}, prefix_entries{0};
  const class PrefixDisk* prefix_disk = nullptr;  // its counters, when the SSD tier is on
  // Speculative decoding (engine/speculative.h): steps that verified drafts, drafts, kept ones.
  std::atomic<uint64_t> draft_steps{0}, draft_tokens{0}, draft_accepted{0};
  SecondsHistogram ttft_s, token_s;
  ExpertUse expert_use;  // per layer and expert: the routers' choices (this process's engine)
  // The grammar's share of a constrained step: the token mask and its application.
  SecondsHistogram grammar_mask_s;
  // The HTTP front (serve/front.cpp).
  std::array<std::atomic<uint64_t>, size_t(Closed::kCount)> closed{};
  std::atomic<int64_t> connections_pending{0}, connections_established{0}, requests_active{0};
  void count_closed(Closed c) { ++closed[size_t(c)]; }
  void count_request(const std::string& endpoint, int status);
  // Requests answered, by endpoint (every status): the dashboard's request count.
  std::map<std::string, uint64_t> requests_by_endpoint() const;
  // The Prometheus text: these (through proto::render_prometheus, prefix expert_serve_), the
  // same load under the names load-aware routers read (vllm:, sglang:), then expertd's (prefix
  // expertd_).
  std::string render(const std::vector<proto::Metric>& daemon) const;
  // The KV positions held, of all: 0..1.
  double kv_usage() const;

 private:
  std::string render_router_gauges() const;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
};

}  // namespace expertd::serve
