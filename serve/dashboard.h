// The page's live dashboard (docs/web.md): one JSON document per tick, made from expert-serve's
// own figures (tokens, requests, prefix cache, latency percentiles, the routers' choices per
// layer and expert) and, when the experts come from expertd, the daemon's counters and its
// per-expert snapshot (residency, hits and misses, engines, the drive, the what-if table), read
// over a monitor connection of its own: the engine loop is never asked, so a viewer cannot
// slow generation beyond the snapshot's own cost, and that is made at most twice a second
// however many viewers there are (they share it).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/metrics.h"

namespace expertd::client {
class Client;
}

namespace expertd::serve {

// What the page is told once (GET /dashboard/info).
struct DashboardInfo {
  std::string model_id, arch, device, experts;  // experts: "local" or expertd's socket
  int n_layer = 0, n_expert = 0, n_expert_used = 0;
  bool chat_template = false;  // false: the page sends /v1/completions
  int sequences_max = 0, n_ctx = 0;
};

class Dashboard {
 public:
  static constexpr std::chrono::milliseconds kTick{1000};        // a viewer's period
  static constexpr std::chrono::milliseconds kSnapshotMin{500};  // shared by every viewer
  static constexpr int kViewersMax = 8;                          // event streams open at once

  // socket: expertd's ("" with --local: no daemon figures). refresh: brings `metrics` up to date
  // before a snapshot where others count (--workers: the engine processes), none where it is.
  Dashboard(DashboardInfo info, Metrics& metrics, std::string socket,
            std::function<void()> refresh = {});
  ~Dashboard();
  nlohmann::json info() const;
  // The latest snapshot as JSON text: made again when older than kSnapshotMin (one caller makes
  // it, the others wait for it and share it).
  std::string snapshot();
  // A viewer's place (kViewersMax of them); false when full.
  bool enter();
  void leave() { --viewers_; }

 private:
  nlohmann::json make();
  nlohmann::json serve_figures() const;
  nlohmann::json route_counts() const;
  void daemon_figures(nlohmann::json& out);  // under mu_

  const DashboardInfo info_;
  Metrics& metrics_;
  const std::string socket_;
  const std::function<void()> refresh_;
  std::atomic<int> viewers_{0};
  std::mutex mu_;  // the snapshot and the monitor connection
  std::string last_;
  std::chrono::steady_clock::time_point last_at_{};
  std::unique_ptr<client::Client> monitor_;
  std::chrono::steady_clock::time_point monitor_retry_{};
  std::string daemon_error_;
};

}  // namespace expertd::serve
