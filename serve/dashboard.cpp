#include "serve/dashboard.h"

#include "client/expert_client.h"
#include "serve/http.h"

namespace expertd::serve {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

Dashboard::Dashboard(DashboardInfo info, Metrics& metrics, std::string socket,
                     std::function<void()> refresh)
    : info_(std::move(info)),
      metrics_(metrics),
      socket_(std::move(socket)),
      refresh_(std::move(refresh)) {}

Dashboard::~Dashboard() = default;

json Dashboard::info() const {
  return {{"model", info_.model_id},
          {"arch", info_.arch},
          {"device", info_.device},
          {"experts", info_.experts},
          {"n_layer", info_.n_layer},
          {"n_expert", info_.n_expert},
          {"n_expert_used", info_.n_expert_used},
          {"chat_template", info_.chat_template},
          {"sequences_max", info_.sequences_max},
          {"n_ctx", info_.n_ctx},
          {"tick_ms", kTick.count()}};
}

bool Dashboard::enter() {
  if (viewers_.fetch_add(1) >= kViewersMax) {
    --viewers_;
    return false;
  }
  return true;
}

std::string Dashboard::snapshot() {
  std::lock_guard lk(mu_);
  const auto now = Clock::now();
  if (last_.empty() || now - last_at_ >= kSnapshotMin) {
    last_ = dump(make());
    last_at_ = now;
  }
  return last_;
}

json Dashboard::make() {
  if (refresh_) refresh_();
  json j{{"t_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count()},
         {"serve", serve_figures()},
         {"routes", nullptr},
         {"daemon", nullptr},
         {"experts", nullptr}};
  if (!socket_.empty()) daemon_figures(j);
  // The routers' choices draw the heat map where expertd's per-expert snapshot does not.
  if (j["experts"].is_null()) j["routes"] = route_counts();
  return j;
}

json Dashboard::serve_figures() const {
  const Metrics& m = metrics_;
  auto pct = [](const SecondsHistogram& h) {
    auto s = [&](double p) { return double(h.h.percentile(p)) / 1e9; };
    return json{{"n", h.h.count()}, {"p50", s(50)}, {"p90", s(90)}, {"p99", s(99)}};
  };
  uint64_t generations = 0;
  for (const auto& [endpoint, n] : m.requests_by_endpoint())
    if (endpoint == "completions" || endpoint == "chat/completions" || endpoint == "messages")
      generations += n;
  return {{"generated_tokens", m.generated_tokens.load()},
          {"prompt_tokens", m.prompt_tokens.load()},
          {"steps", m.steps.load()},
          {"batched_rows", m.batched_rows.load()},
          {"requests", generations},
          {"active_sequences", m.active_sequences.load()},
          {"queue_length", m.queue_length.load()},
          {"prefix_hits", m.prefix_hits.load()},
          {"prefix_misses", m.prefix_misses.load()},
          {"prefix_reused_tokens", m.prefix_reused_tokens.load()},
          {"prefix_cache_bytes", m.prefix_bytes.load()},
          {"draft_tokens", m.draft_tokens.load()},
          {"draft_accepted_tokens", m.draft_accepted.load()},
          {"kv_usage", m.kv_usage()},
          {"ttft_s", pct(m.ttft_s)},
          {"token_s", pct(m.token_s)}};
}

// [layer][expert] of this process's engine (with --workers the engine processes count their
// own: the array is all zeros, and expertd's snapshot is the heat map).
json Dashboard::route_counts() const {
  const ExpertUse& u = metrics_.expert_use;
  json layers = json::array();
  for (int l = 0; l < u.n_layer(); ++l) {
    std::vector<uint64_t> row(size_t(u.n_expert()));
    for (int e = 0; e < u.n_expert(); ++e) row[size_t(e)] = u.at(l, e);
    layers.push_back(std::move(row));
  }
  return layers;
}

// expertd's counters and per-expert snapshot over a monitor connection (made again, at most every
// 2 s, after a failure).
void Dashboard::daemon_figures(json& out) {
  const auto now = Clock::now();
  if (!monitor_ && now >= monitor_retry_) {
    client::Client::Options o;
    o.name = "expert-serve dashboard";
    o.monitor = true;
    o.timeout_ms = 2000;
    auto c = client::Client::connect(socket_, o);
    if (c) {
      monitor_ = std::move(*c);
      daemon_error_.clear();
    } else {
      daemon_error_ = c.error().message;
      monitor_retry_ = now + std::chrono::seconds(2);
    }
  }
  if (!monitor_) {
    out["daemon_error"] = daemon_error_;
    return;
  }
  auto s = monitor_->stats();
  if (!s) {
    out["daemon_error"] = s.error().message;
    monitor_.reset();
    monitor_retry_ = now + std::chrono::seconds(2);
    return;
  }
  json d = json::object();
  for (const auto& m : *s) d[m.name] = m.value;
  out["daemon"] = std::move(d);
  // The per-expert snapshot (residency, hits and misses per expert, engines, the drive, what-if);
  // an expertd older than it answers an error, named in the page, and the counters still come.
  if (auto x = monitor_->experts_json()) {
    json e = json::parse(*x, nullptr, false);
    if (e.is_object())
      out["experts"] = std::move(e);
    else
      out["experts_error"] = "expertd's per-expert snapshot is not a JSON object";
  } else {
    out["experts_error"] = x.error().message;
  }
}

}  // namespace expertd::serve
