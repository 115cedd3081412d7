// Where an MoE layer's experts come from: `local` (in place in the model's tensors, the
// reference) or `daemon` (expertd's shared slots through libexpertclient). Both hand the same
// bytes to the same kernels, so the two paths give bit-identical logits. One fetch path for
// every backend: a backend that reads slots elsewhere than in host memory (CUDA: VRAM) supplies
// SlotMemory, which says where a slot is, makes the backend wait for a slot's copy before it
// reads it, and finishes the reads before a lease is released.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/expert_client.h"
#include "common/result.h"
#include "engine/model.h"
#include "engine/ops.h"

namespace engine {

struct SourceStats {
  uint64_t acquires = 0, experts = 0, ready_at_once = 0, reconnects = 0;
  uint64_t board_acquires = 0;  // served from the residency board, without a round trip
  uint64_t dones = 0;           // used experts handed back for a layer's next wave
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual std::string name() const = 0;
  // The experts are the model's own weights (not a daemon's slots): a backend holding them may run
  // a layer's experts without handing the routes to the source (Ops::moe_resident).
  virtual bool model_owned() const { return false; }
  // Calls fn(indices, weights) with batches of the experts of model layer `layer` as they
  // become available: every expert already resident in one batch, then the rest as they arrive.
  // weights[j] belongs to experts[indices[j]]; each expert comes exactly once, and every call of
  // fn happens before this returns.
  using BatchFn = std::function<void(std::span<const size_t>, std::span<const ExpertWeights>)>;
  virtual expertd::Status for_each_batch(int layer, std::span<const uint32_t> experts,
                                         const BatchFn& fn) = 0;
  // A hint that these experts of a later layer will be needed soon (daemon: Prefetch).
  virtual bool wants_hints() const { return false; }
  virtual void prefetch(int layer, std::span<const uint32_t> experts) {
    (void)layer, (void)experts;
  }
  // Speculative decoding's counts since the last report, for the daemon's stats (daemon:
  // DraftReport; an older daemon's refusal is ignored).
  virtual void report_drafts(uint64_t steps, uint64_t drafted, uint64_t accepted) {
    (void)steps, (void)drafted, (void)accepted;
  }
  const SourceStats& stats() const { return stats_; }
  // The daemon's metrics (empty for the local source).
  virtual std::vector<expertd::proto::Metric> daemon_metrics() { return {}; }

 protected:
  SourceStats stats_;
};

// How a backend reads the daemon's slots. The default: the host arena the client mapped.
class SlotMemory {
 public:
  virtual ~SlotMemory() = default;
  virtual const uint8_t* slot(const expertd::client::Lease& lease, size_t i) {
    return lease.slot_data(i);
  }
  virtual bool on_device() const { return false; }
  // Before the backend reads a slot (CUDA: its stream waits on the slot's event).
  virtual expertd::Status ready(uint32_t slot) {
    (void)slot;
    return {};
  }
  // Before a lease is released: the backend has finished reading its slots.
  virtual expertd::Status finish() { return {}; }
  // A new connection after the daemon came back: a new arena.
  virtual expertd::Status reopen(const expertd::client::ModelInfo& info) {
    (void)info;
    return {};
  }
};

// Experts from the model's own tensors (on a backend that placed them elsewhere, the backend
// resolves the host addresses).
std::unique_ptr<ExpertSource> make_local_source(const Model& m);

// Reconnection: when the daemon goes away mid-eval (a restart, a crash), wait up to
// reconnect_ms for it to come back at `socket`, check it serves the same model, and go on with
// the same numbers (0: the eval fails at once with the connection's error).
struct DaemonOptions {
  std::string socket, arena_kind = "host";
  int reconnect_ms = 0;
};

// Connects to expertd and checks that it serves this model (manifest identity and shapes).
expertd::Result<std::unique_ptr<ExpertSource>> make_daemon_source(const Model& m,
                                                                  const std::string& socket,
                                                                  int reconnect_ms = 0);
// The same over an existing connection, for a backend with its own slot memory.
std::unique_ptr<ExpertSource> make_daemon_source(const Model& m,
                                                 std::unique_ptr<expertd::client::Client> c,
                                                 std::unique_ptr<SlotMemory> slots,
                                                 DaemonOptions o);

// The connection and checks, for an engine that needs an arena of kind `arena_kind` ("host"
// for the CPU backend, "cuda" for the CUDA one).
expertd::Result<std::unique_ptr<expertd::client::Client>> connect_daemon(
    const Model& m, const std::string& socket, const std::string& arena_kind);
expertd::Status check_daemon(const Model& m, const expertd::client::Client& c,
                             const std::string& arena_kind);

}  // namespace engine
