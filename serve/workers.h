// expert-serve --workers M: M engine processes, each with its own batched engine and KV caches,
// on one expertd (its expert cache shared by all of them). The HTTP process keeps the queue and
// hands each request to the worker with the most free sequences; a worker that dies fails its
// requests and is started again.
//
// Protocol: one JSON object per line over a socketpair. To a worker: {"op":"gen","id",
// "prompt":[ids],"params":{...}}, {"op":"cancel","id"}, {"op":"metrics"}. From a worker:
// {"id","text","n"} per token, {"id","done","finish","stop","error"}, {"health","error"} when it
// changes, {"metrics":[...],"counters":{...}}.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve/scheduler.h"

namespace expertd::serve {

// The worker's side: serves the protocol on fd with its own Scheduler until the HTTP process
// goes away (end of file). Returns the exit status.
int run_worker(int fd, Scheduler& sched, Metrics& metrics);

class Workers final : public Generator {
 public:
  // Starts n workers: `argv` (this program's arguments) plus --worker-fd FD each.
  Workers(std::vector<std::string> argv, int n, int parallel, int n_ctx, int queue_max,
          Metrics& metrics);
  ~Workers() override;

  Admit submit(std::shared_ptr<Request> r) override;
  bool healthy() const override;
  std::string last_error() const override;
  int n_ctx() const override { return n_ctx_; }
  std::vector<proto::Metric> daemon_metrics() override;

 private:
  struct Worker {
    int fd = -1;
    pid_t pid = -1;
    bool healthy = false;
    std::string error;
    int active = 0;
    std::thread reader;
    std::mutex write_mu;
    bool metrics_ready = false;
    std::vector<proto::Metric> metrics;
    std::map<std::string, double> counters;
  };
  struct Live {
    std::shared_ptr<Request> req;
    int worker = 0;
    int generated = 0;
    std::string text;
    std::chrono::steady_clock::time_point last;
    bool cancel_sent = false;
  };
  void spawn(int w);
  void read_loop(int w);
  bool send(int w, const std::string& line);
  void dispatch();    // queued requests to workers with free sequences (mu_ held)
  void watch();       // cancellations, dead workers
  void count_load();  // the queue's and the running requests' gauges (mu_ held)

  std::vector<std::string> argv_;
  const int parallel_, n_ctx_, queue_max_;
  Metrics& metrics_;
  std::vector<std::unique_ptr<Worker>> w_;
  mutable std::mutex mu_;
  std::condition_variable metrics_cv_;
  std::map<uint64_t, Live> live_;
  // Dead workers' last reported counters: a replacement starts at 0, and the sums never step back.
  std::map<std::string, double> retired_;
  std::deque<std::shared_ptr<Request>> queue_;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  std::thread watcher_;
};

}  // namespace expertd::serve
