// What other cache sizes would have given (ExpertsReply.what_if, the dashboards' table): a
// bounded ring of the most recent acquires, replayed through the policy lab's simulator
// (daemon/trace_sim.h: the real Cache with the daemon's policy, no drive) at 0.5x, 1x, 2x and 4x
// the arena's slots, on a worker thread of its own, so the control thread only copies the ring.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace expertd::daemon {

struct WhatIfShape {
  uint32_t n_layers = 0, n_experts = 0;
  uint32_t slot_count = 0;  // the arena's: the 1x row
  uint64_t slot_bytes = 0;
  std::string policy;                // the daemon's (--policy)
  uint32_t accesses_max = 1u << 17;  // the ring: expert accesses kept (12 bytes each)
};

struct WhatIfRow {
  uint32_t slots = 0;
  uint64_t cache_mib = 0;
  double hit_rate = -1;  // < 0: the replay could not run at this size (a request over the slots)
};

struct WhatIfResult {
  std::vector<WhatIfRow> rows;  // ascending slots; empty before the first replay
  uint64_t accesses = 0;        // expert accesses replayed
  std::chrono::steady_clock::time_point at;
  double replay_s = 0;  // what the replay cost the worker
};

class WhatIf {
 public:
  // `notify` runs on the worker thread when a replay finishes (the server posts to its
  // io_context from it).
  WhatIf(WhatIfShape shape, std::function<void()> notify);
  ~WhatIf();  // waits for the size being replayed (bounded by the ring's size), skips the rest
  WhatIf(const WhatIf&) = delete;
  WhatIf& operator=(const WhatIf&) = delete;

  // Control thread, per acquire (socket or board): appends its experts, the oldest fall out.
  void record(uint32_t client, uint32_t layer, std::span<const uint32_t> experts);
  // Control thread: the latest finished replay. Starts a new one (a copy of the ring handed to
  // the worker) when none runs, the ring has moved since the last, and the last is older than
  // max(1 s, 10x what it cost): the worker spends at most a tenth of a core on it.
  WhatIfResult poll();
  bool running() const { return running_.load(std::memory_order_acquire); }

 private:
  struct Access {  // one expert of one acquire
    uint32_t seq;  // the acquire's number: the records are rebuilt from runs of equal seq
    uint32_t client;
    uint16_t layer, expert;
  };
  void replay(std::vector<Access> accesses, bool wrapped);  // the worker

  WhatIfShape shape_;
  std::function<void()> notify_;
  std::vector<Access> ring_;  // accesses_max, allocated once
  size_t head_ = 0;           // next write
  bool wrapped_ = false;
  uint32_t seq_ = 0;
  uint64_t recorded_ = 0, replayed_upto_ = 0;
  std::thread worker_;
  std::atomic<bool> running_{false}, stopping_{false};
  std::mutex mu_;  // guards result_
  WhatIfResult result_;
};

}  // namespace expertd::daemon
