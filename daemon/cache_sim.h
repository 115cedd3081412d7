// The Cache without a drive, memory or clients: an arena of slots that holds no bytes, reads that
// complete when asked, and a sink that keeps what the cache said. The trace simulator replays
// the daemon's policies through the real Cache with these (daemon/trace_sim.cpp), and tests drive
// the Cache in-process with them.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "daemon/cache.h"

namespace expertd::daemon::sim {

// slot_count slots of slot_bytes; every read lands in one scratch block (nothing reads it back:
// the cache's checksums are off), published at once.
class NullArena final : public SlotArena {
 public:
  NullArena(uint32_t slots, uint64_t slot_bytes) : slots_(slots), bytes_(slot_bytes) {}
  std::string kind() const override { return "sim"; }
  uint32_t slot_count() const override { return slots_; }
  uint64_t slot_bytes() const override { return bytes_; }
  uint8_t* read_target(uint32_t) override { return scratch_.data(); }
  void publish(uint32_t, uint64_t, std::function<void(Status)> done) override { done({}); }

 private:
  uint32_t slots_;
  uint64_t bytes_;
  std::vector<uint8_t> scratch_ = std::vector<uint8_t>(4096);
};

// Reads queue until complete_all() finishes them, oldest first.
class QueuedReader final : public BlockReader {
 public:
  void read(uint64_t job, uint64_t, uint64_t, uint8_t*, uint32_t, IoPriority) override {
    jobs_.push_back(job);
    ++stats_.reads_submitted;
  }
  void promote(uint64_t) override {}
  const IoStats& stats() const override { return stats_; }
  size_t pending() const { return jobs_.size(); }
  // The oldest read fails with `error` (a drive's EIO).
  void fail_next(Cache& cache, const Error& error) {
    const uint64_t job = jobs_.front();
    jobs_.pop_front();
    cache.on_read_done(job, error);
  }
  void complete_all(Cache& cache) {
    while (!jobs_.empty()) {
      const uint64_t job = jobs_.front();
      jobs_.pop_front();
      cache.on_read_done(job, {});
    }
  }

 private:
  std::deque<uint64_t> jobs_;
  IoStats stats_;
};

// What the cache told its clients, in order.
class RecordingSink final : public CacheSink {
 public:
  struct Grant {
    ClientId client;
    uint64_t request_id, lease_id;
    std::vector<uint32_t> slots;
    std::vector<uint8_t> ready;
  };
  struct Ready {
    ClientId client;
    uint64_t lease_id;
    uint32_t index;
    ErrorCode code;
    uint32_t slot;
  };
  struct Failure {
    ClientId client;
    uint64_t request_id;
    ErrorCode code;
    std::string message;
  };
  std::vector<Grant> grants;
  std::vector<Ready> ready;
  std::vector<Failure> failures;

  void acquire_granted(ClientId c, uint64_t request_id, uint64_t lease_id,
                       std::span<const uint32_t> slots, std::span<const uint8_t> r) override {
    grants.push_back({c, request_id, lease_id, {slots.begin(), slots.end()}, {r.begin(), r.end()}});
  }
  void expert_ready(ClientId c, uint64_t lease_id, uint32_t index, ErrorCode code,
                    const std::string&, uint32_t slot) override {
    ready.push_back({c, lease_id, index, code, slot});
  }
  void request_failed(ClientId c, uint64_t request_id, ErrorCode code,
                      const std::string& message) override {
    failures.push_back({c, request_id, code, message});
  }
};

// A pack of n_layers x n_experts blocks of `stride` bytes (no file behind it).
inline pack::Manifest manifest(uint32_t n_layers, uint32_t n_experts, uint64_t stride = 4096) {
  pack::Manifest m;
  m.n_experts = n_experts;
  m.layers.resize(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) {
    m.layers[l].model_layer = l;
    m.layers[l].base = uint64_t{l} * n_experts * stride;
    m.layers[l].stride = stride;
    m.layers[l].checksums.assign(n_experts, 0);
  }
  return m;
}

}  // namespace expertd::daemon::sim
