#include "serve/workers.h"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

extern char** environ;

namespace expertd::serve {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kWorkerFd = 100;  // where a worker finds its end of the socketpair

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

// Reads lines from fd: false at end of file or on an error.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  bool next(std::string& line) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return true;
      }
      char tmp[65536];
      const ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buf_.append(tmp, size_t(n));
    }
  }

 private:
  int fd_;
  std::string buf_;
};

int finish_code(Finish f) {
  return static_cast<int>(f);
}

}  // namespace

// ---- the worker ----------------------------------------------------------------------------

int run_worker(int fd, Scheduler& sched, Metrics& metrics) {
  std::mutex wmu;
  auto send = [&](const json& j) {
    std::lock_guard lk(wmu);
    return write_all(fd, dump(j));
  };
  std::mutex rmu;
  std::map<uint64_t, std::weak_ptr<Request>> reqs;
  std::atomic<bool> done{false};
  std::thread health([&] {
    int last = -1;
    while (!done) {
      const int h = sched.healthy() ? 1 : 0;
      if (h != last) send({{"health", h == 1}, {"error", sched.last_error()}}), last = h;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  LineReader in(fd);
  std::string line;
  while (in.next(line)) {
    json m = json::parse(line, nullptr, false);
    if (!m.is_object()) continue;
    const std::string op = m.value("op", "");
    if (op == "gen") {
      const uint64_t id = m["id"];
      const GenParams g = params_from_json(m["params"]);
      auto r = std::make_shared<Request>(m["prompt"].get<std::vector<int32_t>>(), g);
      const auto admit = sched.submit(r);
      if (admit != Generator::Admit::Ok) {
        send({{"id", id},
              {"done", true},
              {"finish", finish_code(Finish::Error)},
              {"error", admit == Generator::Admit::QueueFull
                            ? "the worker's queue is full"
                            : "the engine is not available: " + sched.last_error()}});
        continue;
      }
      {
        std::lock_guard lk(rmu);
        reqs[id] = r;
      }
      std::thread([&, r, id] {
        for (;;) {
          Request::Update u = r->take(std::chrono::milliseconds(50));
          if (!u.text.empty() || !u.logprobs.empty() || !u.prompt_logprobs.empty()) {
            json m{{"id", id},
                   {"text", u.text},
                   {"n", u.completion_tokens},
                   {"cached", u.cached_tokens}};
            if (!u.logprobs.empty()) m["lp"] = logprobs_to_json(u.logprobs);
            if (!u.prompt_logprobs.empty()) m["plp"] = logprobs_to_json(u.prompt_logprobs);
            send(m);
          }
          if (u.done) {
            send({{"id", id},
                  {"done", true},
                  {"finish", finish_code(u.finish)},
                  {"stop", u.stop_sequence},
                  {"error", u.error},
                  {"n", u.completion_tokens},
                  {"cached", u.cached_tokens}});
            break;
          }
        }
        std::lock_guard lk(rmu);
        reqs.erase(id);
      }).detach();
    } else if (op == "cancel") {
      std::lock_guard lk(rmu);
      auto it = reqs.find(m.value("id", uint64_t{0}));
      if (it != reqs.end())
        if (auto r = it->second.lock()) r->cancel();
    } else if (op == "metrics") {
      json list = json::array();
      for (const auto& x : sched.daemon_metrics())
        list.push_back({{"name", x.name},
                        {"unit", x.unit},
                        {"help", x.help},
                        {"kind", int(x.kind)},
                        {"value", x.value}});
      send({{"metrics", list},
            {"counters",
             {{"prompt_tokens", double(metrics.prompt_tokens)},
              {"generated_tokens", double(metrics.generated_tokens)},
              {"steps", double(metrics.steps)},
              {"batched_rows", double(metrics.batched_rows)},
              {"draft_steps", double(metrics.draft_steps)},
              {"draft_tokens", double(metrics.draft_tokens)},
              {"draft_accepted", double(metrics.draft_accepted)},
              {"prefix_hits", double(metrics.prefix_hits)},
              {"prefix_disk_hits", double(metrics.prefix_disk_hits)},
              {"prefix_misses", double(metrics.prefix_misses)},
              {"prefix_errors", double(metrics.prefix_errors)},
              {"prefix_reused_tokens", double(metrics.prefix_reused_tokens)},
              {"prefix_evictions", double(metrics.prefix_evictions)}}}});
    }
  }
  // The HTTP process is gone: cancel what runs, let the pumps see the ends, leave.
  {
    std::lock_guard lk(rmu);
    for (auto& [id, w] : reqs)
      if (auto r = w.lock()) r->cancel();
  }
  done = true;
  health.join();
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard lk(rmu);
      if (reqs.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

// ---- the HTTP process's side ---------------------------------------------------------------

Workers::Workers(std::vector<std::string> argv, int n, int parallel, int n_ctx, int queue_max,
                 Metrics& metrics)
    : argv_(std::move(argv)),
      parallel_(parallel),
      n_ctx_(n_ctx),
      queue_max_(queue_max),
      metrics_(metrics) {
  for (int i = 0; i < n; ++i) w_.push_back(std::make_unique<Worker>());
  for (int i = 0; i < n; ++i) spawn(i);
  watcher_ = std::thread([this] { watch(); });
}

Workers::~Workers() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  metrics_cv_.notify_all();
  watcher_.join();
  for (auto& w : w_)
    if (w->fd >= 0) ::shutdown(w->fd, SHUT_RDWR);  // the worker sees the end and exits
  for (auto& w : w_) {
    if (w->reader.joinable()) w->reader.join();
    if (w->pid > 0) {
      for (int i = 0; i < 250 && ::waitpid(w->pid, nullptr, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (::kill(w->pid, 0) == 0) ::kill(w->pid, SIGKILL), ::waitpid(w->pid, nullptr, 0);
    }
    if (w->fd >= 0) ::close(w->fd);
  }
}

void Workers::spawn(int i) {
  Worker& w = *w_[i];
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    w.error = std::string("socketpair: ") + std::strerror(errno);
    return;
  }
  std::vector<std::string> args = argv_;
  args.push_back("--worker-fd");
  args.push_back(std::to_string(kWorkerFd));
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, sv[1], kWorkerFd);  // the copy is not close-on-exec
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, av.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(sv[1]);
  if (rc != 0) {
    ::close(sv[0]);
    w.error = std::string("cannot start an engine process: ") + std::strerror(rc);
    return;
  }
  w.fd = sv[0], w.pid = pid, w.healthy = false, w.active = 0;
  w.error = "the engine process is starting";
  w.reader = std::thread([this, i] { read_loop(i); });
}

bool Workers::send(int i, const std::string& line) {
  Worker& w = *w_[i];
  std::lock_guard lk(w.write_mu);
  return w.fd >= 0 && write_all(w.fd, line);
}

void Workers::read_loop(int i) {
  Worker& w = *w_[i];
  LineReader in(w.fd);
  std::string line;
  while (in.next(line)) {
    json m = json::parse(line, nullptr, false);
    if (!m.is_object()) continue;
    std::unique_lock lk(mu_);
    if (m.contains("health")) {
      w.healthy = m["health"].get<bool>();
      w.error = m.value("error", "");
      if (w.healthy) dispatch();
      continue;
    }
    if (m.contains("metrics")) {
      w.metrics.clear();
      for (const auto& x : m["metrics"])
        w.metrics.push_back({x["name"], x["unit"], x["help"],
                             static_cast<proto::MetricKind>(x["kind"].get<int>()), x["value"]});
      w.counters = m["counters"].get<std::map<std::string, double>>();
      w.metrics_ready = true;
      metrics_cv_.notify_all();
      continue;
    }
    auto it = live_.find(m.value("id", uint64_t{0}));
    if (it == live_.end()) continue;
    Live& l = it->second;
    const auto now = Clock::now();
    if (m.contains("text")) {
      const int n = m.value("n", 0);
      if (l.generated == 0)
        metrics_.ttft_s.observe(std::chrono::duration<double>(now - l.req->arrived).count());
      else if (n > l.generated)
        metrics_.token_s.observe(std::chrono::duration<double>(now - l.last).count() /
                                 (n - l.generated));
      l.generated = n, l.last = now;
      l.req->set_cached(m.value("cached", 0));
      if (m.contains("plp")) l.req->add_logprobs(logprobs_from_json(m["plp"]), true);
      if (m.contains("lp")) l.req->add_logprobs(logprobs_from_json(m["lp"]), false);
      l.req->append(m["text"].get<std::string>(), n);
    }
    if (m.value("done", false)) {
      l.req->set_cached(m.value("cached", 0));
      if (m.value("n", 0) > 0) l.req->append("", m.value("n", 0));
      l.req->finish(static_cast<Finish>(m.value("finish", 0)), m.value("stop", ""),
                    m.value("error", ""));
      live_.erase(it);
      --w.active;
      dispatch();
    }
  }
  // The worker died (or was shut down): its requests end with an error; the watcher restarts it.
  std::lock_guard lk(mu_);
  w.healthy = false;
  w.error = "the engine process exited";
  for (const auto& [k, v] : w.counters) retired_[k] += v;
  w.counters.clear();
  for (auto it = live_.begin(); it != live_.end();)
    if (it->second.worker == i) {
      it->second.req->finish(Finish::Error, {}, "the engine process exited");
      it = live_.erase(it);
    } else {
      ++it;
    }
  w.active = 0;
  ::close(w.fd);
  w.fd = -1;
}

void Workers::dispatch() {
  while (!queue_.empty()) {
    int best = -1;
    for (int i = 0; i < int(w_.size()); ++i)
      if (w_[i]->healthy && w_[i]->active < parallel_ &&
          (best < 0 || w_[i]->active < w_[best]->active))
        best = i;
    if (best < 0) return;
    auto r = queue_.front();
    queue_.pop_front();
    if (r->cancelled()) {
      r->finish(Finish::Error, {}, "cancelled");
      continue;
    }
    const uint64_t id = next_id_++;
    const GenParams& p = r->params;
    json msg{{"op", "gen"}, {"id", id}, {"prompt", r->prompt}, {"params", params_to_json(p)}};
    live_[id] = {r, best, 0, {}, Clock::now(), false};
    ++w_[best]->active;
    if (!send(best, dump(msg))) {
      live_.erase(id);
      --w_[best]->active;
      r->finish(Finish::Error, {}, "the engine process is gone");
    }
  }
  count_load();
}

// The engine processes report no positions: a running request holds its prompt and what it
// generated so far (its prompt counted whole from its dispatch, before its prefill ends).
void Workers::count_load() {
  int64_t positions = 0, queued = 0;
  for (const auto& [id, l] : live_)
    positions += std::min<int64_t>(int64_t(l.req->prompt.size()) + l.generated, n_ctx_);
  for (const auto& r : queue_) queued += int64_t(r->prompt.size());
  metrics_.kv_positions = positions;
  metrics_.queue_length = int64_t(queue_.size());
  metrics_.queued_prompt_tokens = queued;
}

void Workers::watch() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    for (auto& [id, l] : live_)
      if (l.req->cancelled() && !l.cancel_sent)
        l.cancel_sent = send(l.worker, dump({{"op", "cancel"}, {"id", id}}));
    std::erase_if(queue_, [](const std::shared_ptr<Request>& r) {
      if (!r->cancelled()) return false;
      r->finish(Finish::Error, {}, "cancelled");
      return true;
    });
    int64_t active = 0;
    for (int i = 0; i < int(w_.size()); ++i) {
      Worker& w = *w_[i];
      active += w.active;
      if (w.fd < 0 && !stop_) {  // dead: reap it and start another
        lk.unlock();
        if (w.reader.joinable()) w.reader.join();
        if (w.pid > 0) ::waitpid(w.pid, nullptr, 0), w.pid = -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        lk.lock();
        if (!stop_) spawn(i);
      }
    }
    metrics_.active_sequences = active;
    count_load();
    metrics_cv_.wait_for(lk, std::chrono::milliseconds(20));
  }
}

Generator::Admit Workers::submit(std::shared_ptr<Request> r) {
  std::lock_guard lk(mu_);
  bool any = false;
  for (auto& w : w_) any |= w->healthy;
  if (!any) return Admit::Unavailable;
  if (int(queue_.size()) >= queue_max_) {
    dispatch();
    if (int(queue_.size()) >= queue_max_) return Admit::QueueFull;
  }
  queue_.push_back(std::move(r));
  dispatch();
  return Admit::Ok;
}

bool Workers::healthy() const {
  std::lock_guard lk(mu_);
  for (auto& w : w_)
    if (w->healthy) return true;
  return false;
}

std::string Workers::last_error() const {
  std::lock_guard lk(mu_);
  for (auto& w : w_)
    if (!w->error.empty()) return w->error;
  return "";
}

std::vector<proto::Metric> Workers::daemon_metrics() {
  std::unique_lock lk(mu_);
  std::vector<int> asked;
  metrics_.engines_ready = std::count_if(w_.begin(), w_.end(), [](auto& w) { return w->healthy; });
  for (int i = 0; i < int(w_.size()); ++i)
    if (w_[i]->healthy) {
      w_[i]->metrics_ready = false;
      if (send(i, dump({{"op", "metrics"}}))) asked.push_back(i);
    }
  metrics_cv_.wait_for(lk, std::chrono::seconds(5), [&] {
    for (int i : asked)
      if (!w_[i]->metrics_ready) return stop_;
    return true;
  });
  // The engine processes' counters, summed (with those of processes gone).
  std::map<std::string, double> sum = retired_;
  std::vector<proto::Metric> daemon;
  for (int i : asked) {
    if (!w_[i]->metrics_ready) continue;
    for (const auto& [k, v] : w_[i]->counters) sum[k] += v;
    if (daemon.empty()) daemon = w_[i]->metrics;  // one expertd: every worker sees the same
  }
  metrics_.prompt_tokens = uint64_t(sum["prompt_tokens"]);
  metrics_.generated_tokens = uint64_t(sum["generated_tokens"]);
  metrics_.steps = uint64_t(sum["steps"]), metrics_.batched_rows = uint64_t(sum["batched_rows"]);
  metrics_.draft_steps = uint64_t(sum["draft_steps"]);
  metrics_.draft_tokens = uint64_t(sum["draft_tokens"]);
  metrics_.draft_accepted = uint64_t(sum["draft_accepted"]);
  metrics_.prefix_hits = uint64_t(sum["prefix_hits"]);
  metrics_.prefix_disk_hits = uint64_t(sum["prefix_disk_hits"]);
  metrics_.prefix_misses = uint64_t(sum["prefix_misses"]);
  metrics_.prefix_errors = uint64_t(sum["prefix_errors"]);
  metrics_.prefix_reused_tokens = uint64_t(sum["prefix_reused_tokens"]);
  metrics_.prefix_evictions = uint64_t(sum["prefix_evictions"]);
  return daemon;
}

}  // namespace expertd::serve
